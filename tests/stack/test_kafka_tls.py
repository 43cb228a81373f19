"""Every Kafka client of the codebase over mutual TLS, from the settings alone.

Tansu has no TLS listener, so it listens on a private port and advertises a TLS proxy's
(tests/tls_proxy.py) that requires a client certificate signed by a throwaway CA. Each client is
built by the product's own code from ``kafka.ssl_*`` settings: topic creation (kafka-python admin),
the collector's producer, the trainer's release event producer, the health probe, the Dagster
sensor's consumer (kafka-python) and ingestion's fetcher (confluent-kafka). SASL cannot be run here
(Tansu 0.6 has no SASL); tests/schemas/test_kafka_clients.py checks that its settings reach both clients.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentlake.stack.broker import ensure_topics
from agentlake.stack.health import kafka_ok
from agentlake.stack.processes import StackError
from schemas.config import KafkaSettings, Settings, load_settings
from tests.collectors.helpers import running_collector
from tests.tls import KEY_PASSWORD, TlsFiles, make_tls_files
from tests.tls_proxy import TlsBroker

pytest.importorskip("cryptography")
pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def broker(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    with TlsBroker(tls, log=tmp_path_factory.mktemp("tansu") / "tansu.log") as b:
        yield b


def tls_settings(broker: TlsBroker, tls: TlsFiles, tmp_path: Path, **kafka: object) -> Settings:
    return load_settings(
        environ={},
        discover=False,
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "kafka": {
                "bootstrap_servers": broker.bootstrap,
                "spans_topic": f"tls.spans.{tmp_path.name}",
                "rewards_topic": f"tls.rewards.{tmp_path.name}",
                "models_topic": f"tls.models.{tmp_path.name}",
                "model_acks_topic": f"tls.acks.{tmp_path.name}",
                "security_protocol": "SSL",
                "ssl_cafile": str(tls.ca),
                "ssl_certfile": str(tls.client_cert),
                "ssl_keyfile": str(tls.client_key),
                "ssl_key_password": KEY_PASSWORD,
                **kafka,
            },
        },
    )


def fetch_all(k: KafkaSettings, topic: str, expect: int, timeout_s: float = 20.0) -> list[bytes]:
    """Read ``topic`` with ingestion's own fetcher (confluent-kafka over TLS)."""
    from confluent_kafka import TopicPartition

    from pipelines.bronze.fetch import make_fetcher

    consumer = make_fetcher(k)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(k.partitions)])
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            out += [m.value() for m in consumer.consume(100, timeout=0.5) if m.error() is None]
        return out
    finally:
        consumer.close()


def test_every_client_over_mutual_tls(broker: TlsBroker, tls: TlsFiles, tmp_path: Path) -> None:
    from kafka import TopicPartition

    from pipelines.bronze.offset_hints import make_consumer
    from serving.releases import send_release_event

    s = tls_settings(broker, tls, tmp_path)
    k = s.kafka
    assert ensure_topics(k, broker.bootstrap, timeout_s=20) == list(k.our_topics())
    assert kafka_ok(k, broker.bootstrap)

    with running_collector(s) as server:
        r = httpx.post(
            f"http://127.0.0.1:{server.http_port}/v1/traces",
            json={
                "resourceSpans": [
                    {
                        "scopeSpans": [
                            {
                                "spans": [
                                    {
                                        "traceId": "ab" * 16,
                                        "spanId": "cd" * 8,
                                        "name": "llm",
                                        "startTimeUnixNano": str(time.time_ns()),
                                    }
                                ]
                            }
                        ]
                    }
                ]
            },
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert server.sink.limits[k.spans_topic] == k.max_message_bytes  # type: ignore[attr-defined]
    assert send_release_event(k, {"served_name": "agentlake-policy", "version": 7}) is None

    assert len(fetch_all(k, k.spans_topic, expect=1)) == 1
    assert b'"version": 7' in fetch_all(k, k.models_topic, expect=1)[0]
    consumer = make_consumer(k)  # the Dagster sensor's
    try:
        tp = TopicPartition(k.spans_topic, 0)
        parts = consumer.partitions_for_topic(k.spans_topic)
        assert parts == set(range(k.partitions))
        assert consumer.config["check_crcs"] is True and consumer.config["ssl_certfile"] == str(tls.client_cert)
        consumer.end_offsets([tp])
    finally:
        consumer.close()


@pytest.mark.slow  # waits out the clients' TLS failures: ~7 s
def test_a_client_without_its_certificate_is_refused(broker: TlsBroker, tls: TlsFiles, tmp_path: Path) -> None:
    """The proxy demands a client certificate: the same settings minus the files get nowhere."""
    s = tls_settings(broker, tls, tmp_path, ssl_certfile=None, ssl_keyfile=None, ssl_key_password=None)
    with pytest.raises(StackError, match="could not create topics"):
        ensure_topics(s.kafka, broker.bootstrap, timeout_s=3)

    from confluent_kafka import KafkaException

    from pipelines.bronze.fetch import make_fetcher

    consumer = make_fetcher(s.kafka)
    try:
        with pytest.raises(KafkaException, match="(?i)transport|ssl|handshake"):
            consumer.list_topics(timeout=3)
    finally:
        consumer.close()
