"""Release events: what the models topic hears when a version is published, fails or is rolled back.

Serving has already changed when an event is sent, so sending never raises: a Kafka that is away
or refuses the event is logged and its error text is returned for the publish result.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from schemas import topics
from schemas.config import KafkaSettings
from schemas.tables import MODEL_RELEASE_EVENT, schema_version
from schemas.validation import validate_record

log = logging.getLogger(__name__)


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


def send_release_event(kafka: KafkaSettings | None, event: dict[str, Any]) -> str | None:
    """Produce the event on the models topic; returns an error text instead of raising (serving changed)."""
    if kafka is None or not kafka.bootstrap_servers.strip():
        return "no Kafka configured"
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    value = json.dumps(event, default=lambda v: v.isoformat() if isinstance(v, dt.datetime) else str(v))
    headers = [
        (topics.HEADER_SCHEMA_VERSION, str(schema_version(MODEL_RELEASE_EVENT)).encode()),
        (topics.HEADER_CONTENT_TYPE, topics.JSON_CONTENT_TYPE.encode()),
        (topics.HEADER_TENANT, topics.DEFAULT_TENANT.encode()),
    ]
    try:
        producer = KafkaProducer(**kafka.client_config(role="producer"), acks="all", request_timeout_ms=15_000)
        try:
            producer.send(
                kafka.models_topic, key=event["served_name"].encode(), value=value.encode(), headers=headers
            ).get(timeout=20)
        finally:
            producer.close(timeout=5)
    except KafkaError as exc:
        log.warning("release event for %s not sent: %s", event["version"], exc)
        return f"{type(exc).__name__}: {exc}"
    return None
