"""Broker faults under load, with the real OTel SDK exporters doing the retrying.

The fault is a *frozen* broker (SIGSTOP, ``LocalBroker.pause``): connections stay open but
nothing is answered, as with a hung or partitioned broker. We freeze rather than stop it because
Tansu keeps data in memory only: a restarted broker would have lost what was acknowledged before,
which would test Tansu, not us. While frozen, the collector must answer retryable errors (503
with Retry-After / UNAVAILABLE) and stay up; after it thaws, the exporters' retries deliver and
Kafka holds exactly the spans the collector acknowledged: none lost, none doubled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from agentlake.stack.broker import LocalBroker, ensure_topics
from schemas.config import KafkaSettings, load_settings
from tests.collectors.helpers import read_topic, running_collector, spans_of, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


class Recording(SpanExporter):
    """Wraps a real exporter and remembers the spans whose export the collector acknowledged."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.acked: list[tuple[str, str]] = []
        self.failed = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.acked.extend(
                    (format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for s in spans
                )
            else:
                self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


@pytest.fixture()
def own_broker(tmp_path) -> Iterator[tuple[LocalBroker, KafkaSettings]]:
    """A broker of our own: freezing the session broker would stall other tests."""
    with LocalBroker(log_path=tmp_path / "tansu.log") as broker:
        kafka = KafkaSettings(
            bootstrap_servers=broker.bootstrap,
            partitions=4,
            spans_topic="faults.spans",
            rewards_topic="faults.rewards",
            models_topic="faults.models",
        )
        ensure_topics(kafka, broker.bootstrap)
        try:
            yield broker, kafka
        finally:
            broker.resume()  # never leave a stopped process behind


@pytest.mark.slow  # a broker frozen under load, then the stored log checked: ~11 s
def test_frozen_broker_during_load_loses_and_doubles_nothing(own_broker, tmp_path) -> None:
    broker, kafka = own_broker
    settings = load_settings(
        environ={},
        overrides={
            "kafka": kafka.model_dump(),
            "collector": {"produce_timeout_s": 1.0},
            "state": {"dir": str(tmp_path / "state")},
        },
    )
    with running_collector(settings) as server:
        base = f"http://127.0.0.1:{server.http_port}"
        exporters = [
            Recording(HttpExporter(endpoint=f"{base}/v1/traces", timeout=90)),
            Recording(GrpcExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, timeout=90)),
        ]
        providers = []
        for exp in exporters:
            p = TracerProvider()
            p.add_span_processor(
                BatchSpanProcessor(exp, schedule_delay_millis=50, max_export_batch_size=64, max_queue_size=100_000)
            )
            providers.append(p)
        stop = threading.Event()
        created = [0]

        def load() -> None:
            tracers = [p.get_tracer("load") for p in providers]
            i = 0
            while not stop.is_set():
                tracer = tracers[i % 2]
                with tracer.start_as_current_span(f"trace-{i}", attributes={"agentlake.rollout.id": f"r{i}"}):
                    for j in range(4):
                        with tracer.start_as_current_span(f"step-{j}"):
                            pass
                created[0] += 5
                i += 1
                time.sleep(0.01)

        worker = threading.Thread(target=load)
        worker.start()
        try:
            time.sleep(1.5)
            broker.pause()
            # while frozen: retryable answers, and the collector stays up
            time.sleep(1.5)
            r = httpx.post(f"{base}/v1/traces", content=b"\x0a\x00", headers={"content-type": "application/x-protobuf"})
            assert r.status_code == 200  # nothing to write: answered without Kafka
            wait_until(lambda: httpx.get(f"{base}/health", timeout=5).status_code == 503, 10, "health 503")
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

            req = ExportTraceServiceRequest()
            req.resource_spans.add().scope_spans.add().spans.add(
                trace_id=b"\x05" * 16, span_id=b"\x05" * 8, name="x", start_time_unix_nano=1_700_000_000_000_000_000
            )
            r = httpx.post(
                f"{base}/v1/traces",
                content=req.SerializeToString(),
                headers={"content-type": "application/x-protobuf"},
                timeout=10,
            )
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            time.sleep(2.0)
        finally:
            broker.resume()
        time.sleep(1.0)
        stop.set()
        worker.join()
        for p in providers:
            assert p.force_flush(120_000)
            p.shutdown()
        wait_until(lambda: httpx.get(f"{base}/health").status_code == 200, 10, "health 200")
        assert server.collector.stats.failures > 0, "the freeze should have produced retryable errors"
    acked = [s for e in exporters for s in e.acked]
    failed = sum(e.failed for e in exporters)
    assert failed == 0, f"{failed} spans were given up by the exporters"
    assert len(acked) == created[0] and len(set(acked)) == len(acked)
    in_kafka = spans_of(read_topic(kafka, kafka.spans_topic, timeout=60, idle=3.0))
    # The 503-answered probe span above may also land once Kafka thaws (its delivery was pending).
    in_kafka = [s for s in in_kafka if s[0] != "05" * 16]
    assert len(in_kafka) == len(set(in_kafka)), "a span was written twice"
    assert set(in_kafka) == set(acked), "Kafka does not hold exactly the acknowledged spans"
