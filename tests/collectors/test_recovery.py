"""The collector recovers by itself when its broker comes back, and tells the truth meanwhile.

A real Tansu broker on a fixed port is stopped and started again on the same port (Tansu keeps
its log in memory, so the restarted broker is empty and has forgotten the collector's idempotent
producer: the old producer ends in a fatal ``InitProducerId: UnknownError`` and must be replaced).
While it is down: 503 + Retry-After well before the OTel exporter's 10 s deadline, and /health and
the gRPC health say unavailable with the reason. Once it is back: 200 again without a restart,
health ok, and Kafka holds every acknowledged request exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlake.stack.broker import LocalBroker, ensure_topics
from agentlake.stack.ports import free_port
from schemas.config import KafkaSettings, Settings, load_settings
from tests.collectors.helpers import read_topic, running_collector, spans_of, wait_until

# slow: each test waits out a broker outage and the clients' recovery (35-45 s on 2 busy cores)
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(240)]

PROTOBUF = {"content-type": "application/x-protobuf"}


@pytest.fixture()
def broker(tmp_path) -> Iterator[tuple[LocalBroker, KafkaSettings]]:
    port = free_port()
    b = LocalBroker(port=port, log_path=tmp_path / "tansu.log").start()
    kafka = KafkaSettings(
        bootstrap_servers=b.bootstrap,
        partitions=2,
        spans_topic="recovery.spans",
        rewards_topic="recovery.rewards",
        models_topic="recovery.models",
    )
    ensure_topics(kafka, b.bootstrap)
    try:
        yield b, kafka
    finally:
        b.stop()


def settings_for(kafka: KafkaSettings, tmp_path) -> Settings:
    # The collector's own default produce_timeout_s: what a user runs.
    return load_settings(environ={}, overrides={"kafka": kafka.model_dump(), "state": {"dir": str(tmp_path / "s")}})


def restart(b: LocalBroker, kafka: KafkaSettings) -> None:
    """Start the broker again on the same port (empty: Tansu's log is in memory) with our topics."""
    port = b.port
    b.start()
    assert b.port == port
    ensure_topics(kafka, b.bootstrap)


def body(i: int) -> bytes:
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans
    for j in range(3):
        spans.add(
            trace_id=i.to_bytes(16, "big"),
            span_id=(i * 8 + j + 1).to_bytes(8, "big"),
            name=f"s{j}",
            start_time_unix_nano=1_700_000_000_000_000_000,
        )
    return req.SerializeToString()


def span_ids(i: int) -> list[tuple[str, str]]:
    return [(i.to_bytes(16, "big").hex(), (i * 8 + j + 1).to_bytes(8, "big").hex()) for j in range(3)]


def grpc_health(port: int) -> tuple[bytes, str]:
    """grpc.health.v1.Health/Check for the server: (raw response, agentlake-reason)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        response, call = check.with_call(b"", timeout=10)
        reason = dict(call.trailing_metadata() or ()).get("agentlake-reason", "")
        return response, reason


def post_until_ok(client: httpx.Client, url: str, i: int, deadline: float) -> float:
    """Post body ``i`` as an exporter would (same bytes again on 503); the time the 200 came."""
    while True:
        r = client.post(url, content=body(i), headers=PROTOBUF)
        if r.status_code == 200:
            return time.monotonic()
        assert r.status_code == 503 and "retry-after" in r.headers, (r.status_code, r.text)
        assert time.monotonic() < deadline, f"request {i} still 503 after the broker came back: {r.text}"
        time.sleep(0.2)


def test_broker_restart_on_same_port(broker, tmp_path) -> None:
    b, kafka = broker
    with running_collector(settings_for(kafka, tmp_path)) as server, httpx.Client(timeout=30) as client:
        base = f"http://127.0.0.1:{server.http_port}"
        url = f"{base}/v1/traces"
        assert client.get(f"{base}/health").json()["status"] == "ok"
        assert grpc_health(server.grpc_port)[0] == b"\x08\x01"
        for i in range(1, 11):
            assert client.post(url, content=body(i), headers=PROTOBUF).status_code == 200
        before = spans_of(read_topic(kafka, kafka.spans_topic, expect=10))  # records: one per request (one trace)
        assert sorted(before) == sorted(s for i in range(1, 11) for s in span_ids(i))

        b.stop()
        t0 = time.monotonic()
        r = client.post(url, content=body(100), headers=PROTOBUF)
        took = time.monotonic() - t0
        assert r.status_code == 503 and r.headers.get("retry-after") == "1", (r.status_code, r.text)
        assert took < 3.5, f"the 503 came after {took:.1f}s; exporters give up after 10 s"
        wait_until(lambda: client.get(f"{base}/health").status_code == 503, 5, "/health 503 while the broker is down")
        report = client.get(f"{base}/health").json()
        assert report["status"] != "ok" and report["reason"], report
        response, reason = grpc_health(server.grpc_port)
        assert response == b"\x08\x02" and reason, (response, reason)
        # every request during the outage: a quick 503 with Retry-After, never a 200
        for i in range(101, 104):
            t0 = time.monotonic()
            r = client.post(url, content=body(i), headers=PROTOBUF)
            assert r.status_code == 503 and "retry-after" in r.headers and time.monotonic() - t0 < 3.5

        restart(b, kafka)
        back = time.monotonic()
        first_ok = post_until_ok(client, url, 100, back + 30)  # the exporter's retry of the outage request
        recovered_s = first_ok - back
        acked = [100]
        for i in [*range(101, 104), *range(200, 220)]:
            post_until_ok(client, url, i, back + 40)
            acked.append(i)
        wait_until(lambda: client.get(f"{base}/health").status_code == 200, 10, "/health 200 after recovery")
        assert client.get(f"{base}/health").json()["status"] == "ok"
        assert grpc_health(server.grpc_port)[0] == b"\x08\x01"
        assert server.sink.replacements >= 1  # type: ignore[attr-defined]
        print(f"recovered {recovered_s:.1f}s after the broker came back; {server.sink.replacements} replacement(s)")  # type: ignore[attr-defined]

    in_kafka = spans_of(read_topic(kafka, kafka.spans_topic, timeout=30, idle=2.0))
    expected = [s for i in acked for s in span_ids(i)]
    if len(in_kafka) > len(expected):  # a broker that keeps its log also kept what came before
        expected += before
    assert len(in_kafka) == len(set(in_kafka)), "a span was written twice"
    assert sorted(in_kafka) == sorted(expected), "Kafka does not hold exactly the acknowledged requests"


def test_otel_exporters_deliver_through_a_short_outage(broker, tmp_path) -> None:
    """The stock OTLP exporters (default 10 s timeout) retry our 503 / UNAVAILABLE and deliver."""
    b, kafka = broker
    with running_collector(settings_for(kafka, tmp_path)) as server:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("recovery")
        batches = []
        for k in range(2):
            for i in range(5):
                with tracer.start_as_current_span(f"root-{k}-{i}"), tracer.start_as_current_span("child"):
                    pass
            batches.append(memory.get_finished_spans())
            memory.clear()
        exporters = [
            HttpExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces"),
            GrpcExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True),
        ]
        results: list[SpanExportResult | None] = [None, None]

        def export(n: int) -> None:
            results[n] = exporters[n].export(batches[n])

        b.stop()
        threads = [threading.Thread(target=export, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        restart(b, kafka)
        for t in threads:
            t.join(30)
        assert results == [SpanExportResult.SUCCESS, SpanExportResult.SUCCESS], results
        for e in exporters:
            e.shutdown()
    sent = [(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for bt in batches for s in bt]
    # until 2 s of quiet: ``expect`` counts records, and how many records the exporters' batches of
    # spans make is not this test's business (expect=len(sent) waited out the whole timeout)
    in_kafka = spans_of(read_topic(kafka, kafka.spans_topic, timeout=30, idle=2.0))
    assert len(in_kafka) == len(set(in_kafka)), "a span was written twice"
    assert sorted(in_kafka) == sorted(sent)
