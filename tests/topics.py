"""Kafka settings with topics of their own, created on a real broker (tests never share topics)."""

from __future__ import annotations

import uuid

from agentlake.stack.broker import ensure_topics
from schemas.config import KafkaSettings


def fresh_kafka(bootstrap: str, *, prefix: str = "test", partitions: int = 4) -> KafkaSettings:
    """Settings whose spans, rewards and models topics are new and already exist on ``bootstrap``."""
    suffix = uuid.uuid4().hex[:8]
    settings = KafkaSettings(
        bootstrap_servers=bootstrap,
        spans_topic=f"{prefix}.spans.{suffix}",
        rewards_topic=f"{prefix}.rewards.{suffix}",
        models_topic=f"{prefix}.models.{suffix}",
        model_acks_topic=f"{prefix}.acks.{suffix}",
        partitions=partitions,
    )
    ensure_topics(settings, bootstrap)
    return settings
