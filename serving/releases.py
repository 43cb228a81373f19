"""Release events on the models topic: announcements, release commands, and how they travel as JSON.

Announcements (``published``, ``failed``, ``rolled_back``) say that serving has already changed, so
sending one never raises: a Kafka that is away or refuses it is logged and its error text is returned
for the publish result. Commands are what the replicas' loaders act on (serving.loader): ``release``
("serve this version under this name") and ``unload`` ("serve nothing under this name": sent after the
first publish of a line failed, so replicas that took it drop it). ``targets`` names the replicas that
should act (empty: all of them); a full-weight version is sent to one replica at a time. The publisher
that sends a command waits for its acks (serving.release_bus), and a command that could not be sent is
a failed publish.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from schemas import topics
from schemas.config import KafkaSettings
from schemas.kafka import kafka_python_config
from schemas.tables import MODEL_RELEASE_EVENT, schema_version
from schemas.validation import validate_record

log = logging.getLogger(__name__)

RELEASE = "release"  # the status of a command: serve this version
UNLOAD = "unload"  # the status of a command: serve nothing under this name (schema v3)
COMMANDS = (RELEASE, UNLOAD)  # the statuses a loader acts on; the others are announcements


def release_event(row: dict[str, Any], status: str, *, served_name: str, error: str | None = None) -> dict[str, Any]:
    """A ``MODEL_RELEASE_EVENT`` for a registry row, validated against the schema."""
    event = {
        "version": row["version"],
        "served_name": served_name,
        "base_model": row["base_model"],
        "kind": row["kind"],
        "path": row["path"],
        "parent_version": row["parent_version"],
        "status": status,
        "timestamp": dt.datetime.now(dt.UTC),
        "error": error,
    }
    return validate_record(event, MODEL_RELEASE_EVENT)


def release_command(row: dict[str, Any], *, served_name: str, targets: Sequence[str] = ()) -> dict[str, Any]:
    """A ``release`` command for a registry row: a new ``release_id``, where its files are and their hash."""
    event = release_event(row, RELEASE, served_name=served_name)
    event.update(
        release_id=str(uuid.uuid4()),
        artifact_uri=row.get("artifact_uri"),
        manifest_sha256=row.get("manifest_sha256"),
        targets=list(targets),
    )
    return validate_record(event, MODEL_RELEASE_EVENT)


def unload_command(row: dict[str, Any], *, served_name: str, targets: Sequence[str] = ()) -> dict[str, Any]:
    """An ``unload`` command: the replicas drop what they serve under ``served_name`` (``row`` is the version
    that failed; its kind says whether that is an adapter or full weights)."""
    event = release_event(row, UNLOAD, served_name=served_name)
    event.update(release_id=str(uuid.uuid4()), targets=list(targets))
    return validate_record(event, MODEL_RELEASE_EVENT)


def encode(record: dict[str, Any], schema: pa.Schema) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A JSON record's value bytes and our headers (schema version, content type, tenant)."""
    value = json.dumps(record, default=lambda v: v.isoformat() if isinstance(v, dt.datetime) else str(v))
    headers = [
        (topics.HEADER_SCHEMA_VERSION, str(schema_version(schema)).encode()),
        (topics.HEADER_CONTENT_TYPE, topics.JSON_CONTENT_TYPE.encode()),
        (topics.HEADER_TENANT, topics.DEFAULT_TENANT.encode()),
    ]
    return value.encode(), headers


def send_json(
    kafka: KafkaSettings | None, topic: str, key: str, record: dict[str, Any], schema: pa.Schema
) -> str | None:
    """Produce one JSON record with ``acks=all``; an error text instead of raising (None: sent)."""
    if kafka is None or not kafka.bootstrap_servers.strip():
        return "no Kafka configured"
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    value, headers = encode(record, schema)
    try:
        producer = KafkaProducer(**kafka_python_config(kafka, role="producer"), acks="all", request_timeout_ms=15_000)
        try:
            producer.send(topic, key=key.encode(), value=value, headers=headers).get(timeout=20)
        finally:
            producer.close(timeout=5)
    except KafkaError as exc:
        log.warning("%s record for %s not sent: %s", topic, key, exc)
        return f"{type(exc).__name__}: {exc}"
    return None


def send_release_event(kafka: KafkaSettings | None, event: dict[str, Any]) -> str | None:
    """Produce the event on the models topic, keyed by served name (one partition keeps a name's order)."""
    if kafka is None:
        return "no Kafka configured"
    return send_json(kafka, kafka.models_topic, event["served_name"], event, MODEL_RELEASE_EVENT)
