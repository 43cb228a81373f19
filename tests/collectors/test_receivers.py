"""Both receivers against a real broker, driven by the real OTel SDK exporters where possible."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from collectors.receivers import CollectorServer
from schemas import attributes, topics
from schemas.config import Settings
from schemas.tables import SPANS, schema_version
from tests.collectors.helpers import headers_of, read_topic, running_collector, spans_of, wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture()
def collector(settings: Settings) -> Iterator[CollectorServer]:
    with running_collector(settings) as server:
        yield server


def emit(exporter: SpanExporter, traces: int = 3, spans_per_trace: int = 4) -> set[tuple[str, str]]:
    """Create spans with the OTel SDK and export them through ``exporter``; return their ids."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=512))
    tracer = provider.get_tracer("tests")
    ids = set()
    for t in range(traces):
        with tracer.start_as_current_span("rollout", attributes={attributes.ROLLOUT_ID: f"r-{t}"}) as root:
            ids.add((format(root.get_span_context().trace_id, "032x"), format(root.get_span_context().span_id, "016x")))
            for i in range(spans_per_trace - 1):
                with tracer.start_as_current_span(f"step-{i}", attributes={attributes.ROLLOUT_ID: f"r-{t}"}) as s:
                    ctx = s.get_span_context()
                    ids.add((format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")))
    assert provider.force_flush(30_000)
    provider.shutdown()
    return ids


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sdk_exporters_deliver_one_record_per_trace(
    collector: CollectorServer, settings: Settings, protocol: str
) -> None:
    if protocol == "http":
        exporter: SpanExporter = HttpExporter(endpoint=f"http://127.0.0.1:{collector.http_port}/v1/traces")
    else:
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{collector.grpc_port}", insecure=True)
    sent = emit(exporter, traces=3, spans_per_trace=4)
    records = read_topic(settings.kafka, settings.kafka.spans_topic, expect=3)
    assert sorted(spans_of(records)) == sorted(sent)
    assert sorted(r.key for r in records) == sorted({t.encode() for t, _ in sent})  # keyed by trace id
    for r in records:
        h = headers_of(r)
        assert h[topics.HEADER_TENANT] == topics.DEFAULT_TENANT
        assert h[topics.HEADER_SCHEMA_VERSION] == str(schema_version(SPANS))
        assert int(h[topics.HEADER_RECEIVED_AT]) > 1_600_000_000 * 10**9
        assert h[topics.HEADER_CONTENT_TYPE] == topics.SPANS_CONTENT_TYPE
        req = ExportTraceServiceRequest.FromString(r.value)
        assert req.resource_spans[0].resource.attributes[0].key  # resource kept
        assert {kv.key for kv in req.resource_spans[0].resource.attributes} >= {"service.name"}


def _span_request(trace: bytes = b"\x07" * 16, n: int = 2) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(n):
        ss.spans.add(
            trace_id=trace,
            span_id=(i + 1).to_bytes(8, "big"),
            name=f"s{i}",
            start_time_unix_nano=1_700_000_000_000_000_000,
        )
    return req


def test_http_json_gzip_and_partial_success(collector: CollectorServer, settings: Settings) -> None:
    url = f"http://127.0.0.1:{collector.http_port}/v1/traces"
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "js-agent"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "manual"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "ok",
                                "kind": 2,
                                "startTimeUnixNano": "1544712660000000000",
                            },
                            {"traceId": "5b8e", "spanId": "eee19b7ec3c1b174", "name": "short-trace-id"},
                        ],
                    }
                ],
            }
        ]
    }
    r = httpx.post(
        url,
        content=gzip.compress(json.dumps(body).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert "short-trace-id" in r.json()["partialSuccess"]["errorMessage"]
    # protobuf in, protobuf out
    r = httpx.post(url, content=_span_request().SerializeToString(), headers={"content-type": "application/x-protobuf"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(r.content) == ExportTraceServiceResponse()
    records = read_topic(settings.kafka, settings.kafka.spans_topic, expect=2)
    assert sorted(spans_of(records)) == sorted(
        [
            ("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"),
            ("07" * 16, "0000000000000001"),
            ("07" * 16, "0000000000000002"),
        ]
    )


def test_http_errors_are_clear_4xx(collector: CollectorServer, settings: Settings) -> None:
    url = f"http://127.0.0.1:{collector.http_port}/v1/traces"
    r = httpx.post(url, content=b"hello", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/x-protobuf" in r.json()["message"]
    r = httpx.post(url, content=b"\x0a\xff\xff", headers={"content-type": "application/x-protobuf"})
    assert r.status_code == 400
    assert "protobuf" in status_pb2.Status.FromString(r.content).message
    big = b"\x00" * (settings.collector.max_body_bytes + 1)
    r = httpx.post(url, content=big, headers={"content-type": "application/x-protobuf"})
    assert r.status_code == 413
    r = httpx.post(url, content=b"{}", headers={"content-type": "application/json", "content-encoding": "br"})
    assert r.status_code == 415
    r = httpx.get(f"http://127.0.0.1:{collector.http_port}/health")
    assert r.status_code == 200 and r.json()["kafka"] == "reachable"


def test_rewards_endpoint(collector: CollectorServer, settings: Settings) -> None:
    url = f"http://127.0.0.1:{collector.http_port}/v1/rewards"
    events = [{"value": 1.0, "rollout_id": "r-9", "event_id": "e1"}, {"value": 0, "trace_id": "ab" * 16}]
    r = httpx.post(url, json=events)
    assert r.status_code == 200 and r.json() == {"accepted": 2}
    r = httpx.post(url, json={"value": "high", "rollout_id": "r-9"})
    assert r.status_code == 400 and r.json()["message"].startswith("value:")
    r = httpx.post(url, content=b"value=1", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    records = read_topic(settings.kafka, settings.kafka.rewards_topic, expect=2)
    events = sorted((json.loads(r.value) for r in records), key=lambda e: e["value"])
    assert [e["tenant"] for e in events] == [topics.DEFAULT_TENANT] * 2
    assert events[1]["rollout_id"] == "r-9" and events[1]["event_id"] == "e1"
    assert {r.key for r in records} == {b"r-9", b"ab" * 16}


def test_auth_rejects_and_records_tenant(settings: Settings) -> None:
    settings.collector.require_auth = True
    settings.collector.auth_tokens = {"tok-acme": "acme", "tok-beta": "beta"}
    with running_collector(settings) as server:
        url = f"http://127.0.0.1:{server.http_port}/v1/traces"
        body = _span_request().SerializeToString()
        ct = {"content-type": "application/x-protobuf"}
        assert httpx.post(url, content=body, headers=ct).status_code == 401
        assert httpx.post(url, content=body, headers={**ct, "authorization": "Bearer nope"}).status_code == 401
        assert httpx.post(url, content=body, headers={**ct, "authorization": "Basic tok-acme"}).status_code == 401
        rewards = f"http://127.0.0.1:{server.http_port}/v1/rewards"
        assert httpx.post(rewards, json={"value": 1, "rollout_id": "x"}).status_code == 401
        ok = httpx.post(url, content=body, headers={**ct, "authorization": "Bearer tok-acme"})
        assert ok.status_code == 200
        assert (
            httpx.post(
                rewards, json={"value": 1, "rollout_id": "x"}, headers={"authorization": "Bearer tok-beta"}
            ).status_code
            == 200
        )
        # gRPC: the real exporter with and without the token
        with pytest.raises(grpc.RpcError) as err:
            grpc_export(server.grpc_port, _span_request(b"\x08" * 16).SerializeToString(), token=None)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = GrpcExporter(
            endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, headers={"authorization": "Bearer tok-beta"}
        )
        sent = emit(good, traces=1, spans_per_trace=2)
    spans = read_topic(settings.kafka, settings.kafka.spans_topic, expect=2)
    tenants = {headers_of(r)[topics.HEADER_TENANT] for r in spans}
    assert tenants == {"acme", "beta"}
    assert set(sent) <= set(spans_of(spans))
    (reward,) = read_topic(settings.kafka, settings.kafka.rewards_topic, expect=1)
    assert json.loads(reward.value)["tenant"] == "beta" and headers_of(reward)[topics.HEADER_TENANT] == "beta"


def grpc_export(port: int, body: bytes, token: str | None) -> bytes:
    """A raw unary call, to see the exact status code the exporter would get."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        md = [("authorization", f"Bearer {token}")] if token else None
        return call(body, metadata=md, timeout=10)


def test_grpc_invalid_argument(collector: CollectorServer) -> None:
    with pytest.raises(grpc.RpcError) as err:
        grpc_export(collector.grpc_port, b"\x0a\xff\xff", token=None)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ExportTraceServiceResponse.FromString(grpc_export(collector.grpc_port, b"", None)) == (
        ExportTraceServiceResponse()
    )


def test_process_entry_point_serves_and_stops_on_sigterm(settings: Settings, tmp_path) -> None:
    """`python -m collectors` as the stack manager runs it: /health, spans, SIGTERM flushes."""
    from agentlake.stack.ports import free_port

    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "AGENTLAKE_KAFKA__SPANS_TOPIC": settings.kafka.spans_topic,
        "AGENTLAKE_KAFKA__REWARDS_TOPIC": settings.kafka.rewards_topic,
        "AGENTLAKE_COLLECTOR__HTTP_PORT": str(http_port),
        "AGENTLAKE_COLLECTOR__GRPC_PORT": str(grpc_port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{http_port}/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 30, "collector /health")
        sent = emit(HttpExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces"), traces=2, spans_per_trace=2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stdout.read().decode() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(spans_of(read_topic(settings.kafka, settings.kafka.spans_topic, expect=2))) == sorted(sent)
