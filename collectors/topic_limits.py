"""How large a Kafka record may be: our records' sizes, and each topic's ``max.message.bytes``.

Our topics are created with ``kafka.max_message_bytes``, but a topic that existed before (or that
an operator lowered) may take less, and Kafka would refuse our records to it only after they were
sent. ``topic_limits`` reads what the topics take (DescribeConfigs) so that the sink refuses such a
record before producing anything, and ``agentlake up`` warns about such topics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from collectors.records import Record
from schemas.config import KafkaSettings
from schemas.kafka import kafka_python_config

# A one-record batch beyond its key, value and headers: the v2 batch header (61 bytes) and the
# record's own varints (at most 21 bytes), plus 5 varint bytes per header for its two lengths.
_BATCH_OVERHEAD = 61 + 21
_HEADER_OVERHEAD = 10


def record_size(record: Record) -> int:
    """An upper bound of the record's size in a one-record batch, as Kafka counts it (uncompressed)."""
    headers = sum(len(k) + len(v) + _HEADER_OVERHEAD for k, v in record.headers)
    return len(record.value) + len(record.key or b"") + headers + _BATCH_OVERHEAD


def oversized(records: Sequence[Record], limits: dict[str, int], default: int) -> tuple[Record, int, int] | None:
    """The first record bigger than its topic takes, with its size and that limit; None when all fit."""
    for record in records:
        limit = min(default, limits.get(record.topic, default))
        if (size := record_size(record)) > limit:
            return record, size, limit
    return None


def topic_limits(
    settings: KafkaSettings, bootstrap: str, topics: Iterable[str], *, timeout_s: float = 5.0
) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` as the broker describes it; topics it says nothing of are left out.

    Raises ``kafka.errors.KafkaError`` when the broker cannot be asked (callers decide how much that matters).
    """
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    names = list(dict.fromkeys(topics))
    if not names:
        return {}
    wait_ms = int(timeout_s * 1000)
    admin = KafkaAdminClient(
        **kafka_python_config(settings, bootstrap), request_timeout_ms=wait_ms, bootstrap_timeout_ms=wait_ms
    )
    try:
        # "all": Tansu reports the configs a topic was created with as defaults, which "modified" skips
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t) for t in names], config_filter="all"
        )
    finally:
        admin.close()
    out: dict[str, int] = {}
    for name, configs in described.get("topic", {}).items():
        value = (configs.get("max.message.bytes") or {}).get("value")
        if value is None:
            continue
        try:
            out[name] = int(value)
        except (TypeError, ValueError):
            continue
    return out


def smaller_than_ours(settings: KafkaSettings, limits: dict[str, int]) -> list[str]:
    """One line per topic that takes less than ``kafka.max_message_bytes``: what will be refused, and the fix."""
    ours = settings.max_message_bytes
    return [
        f"Kafka topic {topic!r} takes records of at most {limit} bytes (max.message.bytes), less than "
        f"kafka.max_message_bytes = {ours}: bigger traces will be refused with 413. Raise the topic's "
        f"max.message.bytes to {ours} (kafka-configs --alter --add-config max.message.bytes={ours}) "
        "or lower kafka.max_message_bytes"
        for topic, limit in sorted(limits.items())
        if limit < ours
    ]
