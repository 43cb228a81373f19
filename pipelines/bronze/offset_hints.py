"""A kafka-python consumer for offset look-ups: the sensor's end-offset hints.

Ingestion itself reads with confluent-kafka (`pipelines.bronze.fetch`); positions come from the
lake, never from Kafka (`pipelines.bronze.positions`).
"""

from __future__ import annotations

from typing import Any

from schemas.config import KafkaSettings
from schemas.kafka import kafka_python_config


def make_consumer(kafka: KafkaSettings, **overrides: Any) -> Any:
    """A kafka-python consumer with no group, for offset look-ups (the sensor's end-offset hints);
    ``overrides`` tune it (the viewer's short timeouts)."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **kafka_python_config(kafka, role="consumer"),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
        **overrides,
    )


def end_offsets_hint(consumer: Any, topic: str) -> dict[int, int]:
    """End offsets as the broker reports them; Tansu reports the last batch's base, so a hint only."""
    from kafka import TopicPartition

    parts = consumer.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()} if tps else {}
