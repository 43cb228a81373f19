"""Topics are created with our settings, read back through DescribeConfigs from the real broker.

What Tansu 0.6 does with them, found here: it keeps the configs a topic is created with and describes
them back (as DEFAULT_CONFIG, so the admin clients' default "modified" filter hides them), but it
does not enforce ``max.message.bytes`` (a 2 MB record goes into a topic created with 2048), and it
accepts any replication factor on its one node. So ``ensure_topics`` refuses a replication factor
above the cluster's broker count itself, and the collector checks record sizes itself
(tests/collectors/test_record_limits.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentlake.stack.broker import ensure_topics
from agentlake.stack.processes import StackError
from schemas.config import KafkaSettings
from schemas.kafka import kafka_python_config, librdkafka_config

pytestmark = pytest.mark.kafka


def settings(bootstrap: str, **values: Any) -> KafkaSettings:
    suffix = uuid.uuid4().hex[:8]
    return KafkaSettings(
        bootstrap_servers=bootstrap,
        spans_topic=f"t.spans.{suffix}",
        rewards_topic=f"t.rewards.{suffix}",
        models_topic=f"t.models.{suffix}",
        model_acks_topic=f"t.acks.{suffix}",
        **values,
    )


@pytest.fixture()
def admin(kafka_bootstrap: str) -> Iterator[Any]:
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(**kafka_python_config(KafkaSettings(), kafka_bootstrap), request_timeout_ms=10_000)
    yield client
    client.close()


def described(admin: Any, topic: str) -> dict[str, str]:
    from kafka.admin import ConfigResource, ConfigResourceType

    res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    return {k: v["value"] for k, v in res["topic"][topic].items()}


def test_new_topics_carry_the_settings(kafka_bootstrap: str, admin: Any) -> None:
    k = settings(kafka_bootstrap, partitions=3, max_message_bytes=5_000_000, retention_ms=86_400_000)
    created = ensure_topics(k, kafka_bootstrap)
    assert created == [k.spans_topic, k.rewards_topic, k.models_topic, k.model_acks_topic]
    for topic in created:
        configs = described(admin, topic)
        assert configs["max.message.bytes"] == "5000000"
        assert configs["cleanup.policy"] == "delete"
        assert configs["retention.ms"] == "86400000"
    (meta,) = admin.describe_topics([k.spans_topic])
    assert len(meta["partitions"]) == 3
    assert all(len(p["replica_nodes"]) == k.replication_factor == 1 for p in meta["partitions"])
    assert ensure_topics(k, kafka_bootstrap) == []  # idempotent


def test_librdkafka_reads_the_same_configs(kafka_bootstrap: str) -> None:
    """Ingestion's client (confluent-kafka) sees what kafka-python created."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    k = settings(kafka_bootstrap)
    ensure_topics(k, kafka_bootstrap, [k.spans_topic])
    client = AdminClient(librdkafka_config(k, role="admin"))
    (future,) = client.describe_configs([ConfigResource("topic", k.spans_topic)]).values()
    configs = {name: entry.value for name, entry in future.result(timeout=10).items()}
    assert configs["max.message.bytes"] == str(k.max_message_bytes) == str((16 << 20) + (64 << 10))
    assert configs["retention.ms"] == "-1"


def test_replication_factor_above_the_brokers_is_refused(kafka_bootstrap: str, admin: Any) -> None:
    k = settings(kafka_bootstrap, replication_factor=3)
    with pytest.raises(StackError, match=r"kafka\.replication_factor = 3 but .* has 1 broker"):
        ensure_topics(k, kafka_bootstrap, timeout_s=10)
    assert k.spans_topic not in admin.list_topics()  # nothing half-made


def test_an_existing_smaller_topic_is_warned_about(
    kafka_bootstrap: str, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka.admin import NewTopic

    k = settings(kafka_bootstrap)
    admin.create_topics([NewTopic(k.spans_topic, 1, 1, topic_configs={"max.message.bytes": "1048588"})])
    with caplog.at_level(logging.WARNING, logger="agentlake.stack.broker"):
        created = ensure_topics(k, kafka_bootstrap)
    assert created == [k.rewards_topic, k.models_topic, k.model_acks_topic]
    # ours only: on a loaded machine kafka-python also warns of a slow task in its event loop
    ours = [r for r in caplog.records if r.name == "agentlake.stack.broker"]
    warnings = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # only the old topic: the new ones take what we send
    assert k.spans_topic in warnings[0] and "1048588" in warnings[0] and "413" in warnings[0]
    assert described(admin, k.spans_topic)["max.message.bytes"] == "1048588"  # left as it was
