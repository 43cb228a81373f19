"""Malformed, truncated, oversized and wrongly typed bodies: never a crash, never a 500.

The receivers run on an in-memory sink (decoding and HTTP/gRPC handling are what is under test,
and thousands of Kafka round trips would only slow the search down); a final request checks the
server is still healthy.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.server import CollectorServer
from collectors.sink import MemorySink
from schemas.config import Settings, load_settings
from tests.collectors.helpers import running_collector

# 1,000 bodies per entry point, 3,000 in all: the "thousands" the collector promises to survive.
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _valid_body() -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(3):
        s = ss.spans.add(trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=f"s{i}")
        s.attributes.add(key="k", value={"string_value": "v" * i})
    return req.SerializeToString()


VALID = _valid_body()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
otlp_keys = st.sampled_from(
    [
        "resourceSpans",
        "scopeSpans",
        "spans",
        "traceId",
        "spanId",
        "name",
        "attributes",
        "value",
        "stringValue",
        "kind",
        "startTimeUnixNano",
        "rollout_id",
        "trace_id",
    ]
)
otlp_like = st.recursive(
    st.none() | st.integers() | st.text(max_size=34) | st.sampled_from(["ab" * 16, "cd" * 8, "zz"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(otlp_keys, inner, max_size=4),
    max_leaves=25,
)
mutated_protobuf = st.builds(
    lambda cut, flips: bytes(b ^ flips.get(i, 0) for i, b in enumerate(VALID[:cut])),
    st.integers(0, len(VALID)),
    st.dictionaries(st.integers(0, len(VALID) - 1), st.integers(1, 255), max_size=4),
)
bodies = st.one_of(
    st.binary(max_size=300),
    mutated_protobuf,
    json_values.map(lambda v: json.dumps(v).encode()),
    otlp_like.map(lambda v: json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [v]}]}]}).encode()),
    otlp_like.map(lambda v: json.dumps(v).encode()),
)
content_types = st.sampled_from(
    [
        "application/x-protobuf",
        "application/json",
        "application/protobuf",
        "text/plain",
        "",
        "application/json; charset=utf-8",
        "multipart/form-data",
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[CollectorServer]:
    s: Settings = load_settings(environ={}, overrides={"collector": {"max_body_bytes": 4096}})
    with running_collector(s, MemorySink()) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: CollectorServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=10) as c:
        yield c


def _assert_4xx_or_ok(r: httpx.Response) -> None:
    assert r.status_code in (200, 400, 413, 415), (r.status_code, r.text[:200])
    if r.status_code != 200:
        assert r.content, "an error answer must say what is wrong"


@FUZZ
@given(body=bodies, ctype=content_types, gz=st.sampled_from([None, "gzip", "gzip-truncated", "deflate"]))
def test_http_traces_never_500(client: httpx.Client, body: bytes, ctype: str, gz: str | None) -> None:
    headers = {"content-type": ctype}
    if gz == "gzip":
        body, headers["content-encoding"] = gzip.compress(body), "gzip"
    elif gz == "gzip-truncated":
        body, headers["content-encoding"] = gzip.compress(body)[:-5], "gzip"
    elif gz == "deflate":
        headers["content-encoding"] = "deflate"
    _assert_4xx_or_ok(client.post("/v1/traces", content=body, headers=headers))


reward_like = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "value": json_values | st.floats(allow_nan=True, allow_infinity=True),
            "rollout_id": json_values,
            "trace_id": st.text(max_size=40) | json_values,
            "response_id": json_values,
            "name": json_values,
            "timestamp": json_values | st.sampled_from(["2024-01-01T00:00:00Z", "2024-01-01", "yesterday"]),
            "tenant": json_values,
            "extra": json_values,
        },
    ),
)


@FUZZ
@given(event=st.one_of(reward_like, st.lists(reward_like, max_size=3)), raw=st.binary(max_size=100) | st.none())
def test_http_rewards_never_500(client: httpx.Client, event: object, raw: bytes | None) -> None:
    body = raw if raw is not None else json.dumps(event).encode()
    _assert_4xx_or_ok(client.post("/v1/rewards", content=body, headers={"content-type": "application/json"}))


@FUZZ
@given(body=st.one_of(st.binary(max_size=300), mutated_protobuf, st.binary(min_size=5000, max_size=6000)))
def test_grpc_never_internal(server: CollectorServer, channel: grpc.Channel, body: bytes) -> None:
    call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    try:
        call(body, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), exc
        assert exc.details()


@pytest.fixture(scope="module")
def channel(server: CollectorServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch


def test_still_healthy_and_oversized(client: httpx.Client) -> None:
    ok = client.post("/v1/traces", content=VALID, headers={"content-type": "application/x-protobuf"})
    assert ok.status_code == 200
    r = client.post("/v1/traces", content=b"\x00" * 5000, headers={"content-type": "application/x-protobuf"})
    assert r.status_code == 413
    bomb = gzip.compress(b"\x00" * 1_000_000)
    r = client.post(
        "/v1/traces", content=bomb, headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"}
    )
    assert r.status_code == 413
    assert client.get("/health").status_code == 200
