"""Issue 11 at the collector: hostile input always gets a 4xx naming the field, the connection survives,
nothing acknowledged is lost, and one big valid request does not stall the other clients.

The receivers are the real ones (HTTP on uvicorn, gRPC on grpc.aio) over sockets; the sink is the
in-memory one, so what was stored can be counted exactly without a broker.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collectors.errors import BadRequest, PayloadTooLarge
from collectors.receivers import CollectorServer
from collectors.records import decompress, split_traces
from collectors.sink import MemorySink
from pipelines.bronze.decoding import KafkaRecord, decode_spans
from schemas import attributes as A
from schemas import span_checks
from schemas.config import load_settings
from tests.collectors.helpers import running_collector

NOW_NS = 1_750_000_000_000_000_000
PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class Ids:
    """Unique trace ids, so that every valid request is a different body (no dedupe) and can be found."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> bytes:
        self.n += 1
        return (0xA1 << 120 | self.n).to_bytes(16, "big")


new_trace = Ids()


def request(*spans: Span) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="hostile-test"))
    rs.scope_spans.add().spans.extend(spans)
    return req


def span(trace_id: bytes | None = None, name: str = "step", **fields: Any) -> Span:
    """A valid span unless ``fields`` say otherwise; ``attrs`` is a dict of AnyValue."""
    attrs = fields.pop("attrs", {})
    s = Span(
        trace_id=trace_id or new_trace(),
        span_id=fields.pop("span_id", b"\x00" * 7 + b"\x01"),
        name=name,
        start_time_unix_nano=fields.pop("start", NOW_NS),
        end_time_unix_nano=fields.pop("end", NOW_NS + 10**6),
        **fields,
    )
    for k, v in attrs.items():
        s.attributes.add(key=k, value=v)
    return s


def ints(*values: int) -> AnyValue:
    return AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=v) for v in values]))


def otlp_json(req: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON as real senders write it: hex ids (protobuf's canonical JSON has base64)."""
    data = json_format.MessageToDict(req)
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = json_format.base64.b64decode(s[k]).hex()
    return data


@pytest.fixture(scope="module")
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture(scope="module")
def server(sink: MemorySink) -> Iterator[CollectorServer]:
    with running_collector(load_settings(environ={}), sink) as srv:
        yield srv


@pytest.fixture()
def client(server: CollectorServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=120) as c:
        yield c


def local_port(r: httpx.Response) -> int:
    """The client side of the connection a response came on: equal ports, same kept-alive connection."""
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def stored_traces(sink: MemorySink) -> set[bytes]:
    return {r.key for r in sink.records if r.spans}


def valid_after(client: httpx.Client, sink: MemorySink, bad: httpx.Response) -> None:
    """A valid export on the same connection right after a refused one: answered, on it, and stored."""
    trace = new_trace()
    ok = client.post("/v1/traces", content=request(span(trace)).SerializeToString(), headers=PROTOBUF)
    assert ok.status_code == 200, ok.text
    assert local_port(ok) == local_port(bad), "the refused request closed the keep-alive connection"
    assert trace.hex().encode() in stored_traces(sink)


# --- the three 500s of the issue -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        (b'{"value": 1' + b"0" * 400 + b', "rollout_id": "r"}', "value"),  # OverflowError
        (b'{"value": 1, "rollout_id": "r", "timestamp": "0001-01-01T00:00:00+01:00"}', "timestamp"),  # date range
        (b'{"value": 1, "rollout_id": "\\ud800"}', "rollout_id"),  # UnicodeEncodeError on the Kafka key
        (b'[{"value": 1, "rollout_id": "a"}, {"value": 1, "rollout_id": "b", "name": "\\udc00x"}]', "[1].name"),
        (b'{"value": 1, "rollout_id": "r", "\\ud800": 1}', "\\ud800"),  # a key: quoted in the message, escaped
    ],
)
def test_hostile_rewards_get_400_naming_the_field(
    client: httpx.Client, sink: MemorySink, body: bytes, field: str
) -> None:
    before = len(sink.records)
    r = client.post("/v1/rewards", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    assert field in r.json()["message"], r.json()
    assert len(sink.records) == before
    valid_after(client, sink, r)


SURROGATE_PLACES = [
    # protobuf's JSON parser raised SystemError on these (a name looked up in its field or enum map)
    "span kind",
    "status code",
    "unknown field name",
    "field name inside a value",
    # its ParseError quoted the surrogate, and the 400 could not be encoded: a 500 all the same
    "double value",
    # these were a 400 already; they stay one, now naming the field
    "name",
    "attribute value",
    "attribute key",
    "resource attribute",
    "scope name",
]


@pytest.mark.parametrize("where", SURROGATE_PLACES)
def test_lone_surrogate_in_otlp_json_gets_400(client: httpx.Client, sink: MemorySink, where: str) -> None:
    data = otlp_json(request(span(attrs={"k": AnyValue(string_value="v")})))
    s = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    attr = s["attributes"][0]
    if where == "span kind":
        s["kind"] = "\ud800"
    elif where == "status code":
        s["status"] = {"code": "SPAN_\udc00"}
    elif where == "unknown field name":
        s["\ud800"] = 1
    elif where == "field name inside a value":
        attr["value"] = {"\ud800": 1}
    elif where == "double value":
        attr["value"] = {"doubleValue": "\ud800"}
    elif where == "name":
        s["name"] = "\ud800"
    elif where == "attribute value":
        attr["value"]["stringValue"] = "ok \udbff"
    elif where == "attribute key":
        attr["key"] = "\udfff"
    elif where == "resource attribute":
        data["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"] = "\ud834"
    else:
        data["resourceSpans"][0]["scopeSpans"][0]["scope"] = {"name": "\ud800"}
    body = json.dumps(data).encode()  # ensure_ascii: the surrogate travels as a \\u escape
    assert b"\\ud" in body
    r = client.post("/v1/traces", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["message"] and r.json()["message"].startswith("resourceSpans[0]")
    valid_after(client, sink, r)


def test_valid_surrogate_pairs_and_unicode_are_fine(client: httpx.Client, sink: MemorySink) -> None:
    trace = new_trace()
    data = otlp_json(request(span(trace, name="emoji 😀 é")))
    body = json.dumps(data).encode()  # 😀 as the pair \ud83d\ude00
    assert b"\\ud83d\\ude00" in body
    r = client.post("/v1/traces", content=body, headers=JSON)
    assert r.status_code == 200, r.text
    assert trace.hex().encode() in stored_traces(sink)


def test_raw_surrogate_bytes_are_not_utf8(client: httpx.Client) -> None:
    """json.loads(bytes) decodes with surrogatepass; the receiver decodes strictly first."""
    body = b'{"value": 1, "rollout_id": "\xed\xa0\x80"}'
    r = client.post("/v1/rewards", content=body, headers=JSON)
    assert r.status_code == 400 and "UTF-8" in r.json()["message"]


# --- gzip with several members ---------------------------------------------------------------------


def test_every_gzip_member_is_read(client: httpx.Client, sink: MemorySink) -> None:
    """Two members (as `cat a.gz b.gz` makes): both traces stored; today the second was dropped with a 200."""
    first, second = new_trace(), new_trace()
    body = gzip.compress(request(span(first)).SerializeToString()) + gzip.compress(
        request(span(second)).SerializeToString()
    )
    r = client.post("/v1/traces", content=body, headers={**PROTOBUF, "content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert {first.hex().encode(), second.hex().encode()} <= stored_traces(sink)
    events = [{"value": 1, "rollout_id": "gz-1"}]
    body = gzip.compress(json.dumps(events).encode()[:-1]) + gzip.compress(b', {"value": 2, "rollout_id": "gz-2"}]')
    r = client.post("/v1/rewards", content=body, headers={**JSON, "content-encoding": "gzip"})
    assert r.status_code == 200 and r.json() == {"accepted": 2}, r.text


def test_gzip_members_are_bounded_together() -> None:
    one = gzip.compress(b"x" * 600)
    assert decompress(one + b"\0\0\0" + one, "gzip", limit=1200) == b"x" * 1200  # zero padding between members
    with pytest.raises(PayloadTooLarge):
        decompress(one * 3, "gzip", limit=1200)  # each member under the limit, together over it
    with pytest.raises(BadRequest, match="truncated"):
        decompress(one + one[:-4], "gzip", limit=1200)
    with pytest.raises(BadRequest, match="member 2"):
        decompress(one + b"garbage", "gzip", limit=1200)
    with pytest.raises(BadRequest):
        decompress(b"", "gzip", limit=1200)
    many = gzip.compress(b"", mtime=0) * 50_000  # a million bytes of empty members: linear, not quadratic
    started = time.perf_counter()
    assert decompress(many, "gzip", limit=1200) == b""
    assert time.perf_counter() - started < 5


# --- spans the lake would quarantine or store wrongly: refused now -------------------------------


BAD_SPANS: list[tuple[str, dict[str, Any], str]] = [
    ("kind 99", {"kind": 99}, "kind"),
    ("status code 7", {"status": {"code": 7}}, "status.code"),
    ("start 0", {"start": 0, "end": 0}, "start_time_unix_nano"),
    ("start 2**64-1", {"start": 2**64 - 1, "end": 0}, "start_time_unix_nano"),
    ("end 2**64-1", {"end": 2**64 - 1}, "end_time_unix_nano"),
    ("end before start", {"end": NOW_NS - 1}, "end_time_unix_nano"),
    ("negative token id", {"attrs": {A.LLM_PROMPT_TOKEN_IDS: ints(1, -1)}}, A.LLM_PROMPT_TOKEN_IDS),
    ("token id 2**31", {"attrs": {A.LLM_COMPLETION_TOKEN_IDS: ints(2**31)}}, A.LLM_COMPLETION_TOKEN_IDS),
    (
        "token ids as a bad JSON string",
        {"attrs": {A.AGL_RESPONSE_TOKEN_IDS: AnyValue(string_value="[1, -5]")}},
        A.AGL_RESPONSE_TOKEN_IDS,
    ),
    (
        "token ids of strings",
        {"attrs": {A.LLM_PROMPT_TOKEN_IDS: AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="1")]))}},
        A.LLM_PROMPT_TOKEN_IDS,
    ),
    (
        "logprobs of strings",
        {"attrs": {A.LLM_COMPLETION_LOGPROBS: AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")]))}},
        A.LLM_COMPLETION_LOGPROBS,
    ),
    (
        "logprobs not a list",
        {"attrs": {A.LLM_COMPLETION_LOGPROBS: AnyValue(string_value="-0.5")}},
        A.LLM_COMPLETION_LOGPROBS,
    ),
]


def bad_span(fields: dict[str, Any], trace: bytes | None = None) -> Span:
    fields = dict(fields)
    status = fields.pop("status", None)
    s = span(trace, **fields)
    if status:
        s.status.code = status["code"]
    return s


@pytest.mark.parametrize("case, fields, field", BAD_SPANS, ids=[c for c, _, _ in BAD_SPANS])
def test_unusable_span_gets_400_naming_the_field(
    client: httpx.Client, sink: MemorySink, case: str, fields: dict[str, Any], field: str
) -> None:
    before = len(sink.records)
    r = client.post("/v1/traces", content=request(bad_span(fields)).SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 400, (case, r.status_code)
    message = status_pb2.Status.FromString(r.content).message
    assert field in message, message
    assert len(sink.records) == before, "nothing of a refused request is stored"
    valid_after(client, sink, r)


def test_reward_span_value_must_be_a_number(client: httpx.Client, sink: MemorySink) -> None:
    """Ingestion's float() raised on it and quarantined the whole record."""
    s = span(name=A.REWARD_SPAN_NAME, attrs={A.REWARD_VALUE: AnyValue(string_value="high")})
    r = client.post("/v1/traces", content=request(s).SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 400 and A.REWARD_VALUE in r.text
    good = span(name=A.REWARD_SPAN_NAME, attrs={A.REWARD_VALUE: AnyValue(string_value="0.75")})
    r = client.post("/v1/traces", content=request(good).SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"kind": "NOPE"}, "spans[0].kind"),  # protobuf's parser read an unknown name as 0, silently
        ({"status": {"code": "STATUS_CODE_MAYBE"}}, "spans[0].status.code"),
        ({"kind": 42}, "kind"),
        ({"startTimeUnixNano": "0"}, "start_time_unix_nano"),
        ({"startTimeUnixNano": str(2**64 - 1)}, "start_time_unix_nano"),
    ],
)
def test_unusable_span_in_otlp_json_gets_400(
    client: httpx.Client, sink: MemorySink, patch: dict[str, Any], field: str
) -> None:
    data = otlp_json(request(span()))
    data["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(patch)
    r = client.post("/v1/traces", json=data)
    assert r.status_code == 400, r.text
    assert field in r.json()["message"], r.json()
    valid_after(client, sink, r)


def test_known_enum_names_in_json_still_work(client: httpx.Client, sink: MemorySink) -> None:
    trace = new_trace()
    data = otlp_json(request(span(trace)))
    data["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(
        {"kind": "SPAN_KIND_CLIENT", "status": {"code": "STATUS_CODE_ERROR", "message": "boom"}}
    )
    assert client.post("/v1/traces", json=data).status_code == 200
    (rec,) = [r for r in sink.records if r.key == trace.hex().encode()]
    s = ExportTraceServiceRequest.FromString(rec.value).resource_spans[0].scope_spans[0].spans[0]
    assert s.kind == Span.SPAN_KIND_CLIENT and s.status.code == 2


def test_some_bad_spans_partial_success_and_only_good_ones_stored(client: httpx.Client, sink: MemorySink) -> None:
    """OTLP partial success: the good spans are stored, the bad ones counted and named, none stored."""
    good, bad = new_trace(), new_trace()
    req = request(
        span(good, span_id=b"\x01" * 8),
        bad_span({"kind": 99, "span_id": b"\x02" * 8}, good),  # same trace as a good span: only it is refused
        bad_span({"start": 0, "end": 0}, bad),
    )
    r = client.post("/v1/traces", content=req.SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 200, r.text
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 2
    assert "kind" in partial.error_message and "start_time_unix_nano" in partial.error_message
    (rec,) = [r for r in sink.records if r.key == good.hex().encode()]
    stored = ExportTraceServiceRequest.FromString(rec.value).resource_spans[0].scope_spans[0].spans
    assert [s.span_id for s in stored] == [b"\x01" * 8]
    assert bad.hex().encode() not in stored_traces(sink)


def test_grpc_refuses_with_invalid_argument_and_the_channel_keeps_working(
    server: CollectorServer, sink: MemorySink
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(EXPORT)
        for _, fields, field in BAD_SPANS:
            with pytest.raises(grpc.RpcError) as err:
                export(request(bad_span(fields)).SerializeToString(), timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in err.value.details()
        trace = new_trace()
        answer = ExportTraceServiceResponse.FromString(export(request(span(trace)).SerializeToString(), timeout=30))
        assert answer == ExportTraceServiceResponse()
    assert trace.hex().encode() in stored_traces(sink)


def test_error_messages_are_bounded(client: httpx.Client) -> None:
    key = "k" * 1_000_000
    r = client.post("/v1/rewards", json={"value": 1, "rollout_id": "r", key: 1})
    assert r.status_code == 400 and len(r.content) < 5_000


# --- the collector's checks and ingestion's quarantine agree ---------------------------------------


def test_nothing_the_collector_stores_is_quarantined_by_ingestion() -> None:
    """Every span the strict split keeps decodes in the pipeline; every one it refuses is one the lake
    would quarantine or store wrongly (kind, status, times: stored as UNSPECIFIED, UNSET, 1970 or 2554)."""
    spans = [bad_span(fields) for _, fields, _ in BAD_SPANS] + [
        span(attrs={A.LLM_PROMPT_TOKEN_IDS: ints(1, 2), A.LLM_COMPLETION_LOGPROBS: AnyValue(string_value="[-0.5]")}),
        span(name=A.REWARD_SPAN_NAME, attrs={A.REWARD_VALUE: AnyValue(double_value=0.5)}),
    ]
    for s in spans:
        req = request(s)
        strict = split_traces(req, tenant="t", topic="spans", received_at_ns=NOW_NS, strict=True)
        loose = split_traces(req, tenant="t", topic="spans", received_at_ns=NOW_NS)
        (rec,) = loose.records
        table, quarantine = decode_spans([KafkaRecord("spans", 0, 0, rec.key, rec.value, rec.headers)])
        if strict.records:
            assert not quarantine and table.num_rows == 1, s
        elif {kv.key for kv in s.attributes} & span_checks.CHECKED_KEYS:
            assert quarantine, f"refused, yet ingestion takes it: {s}"
        else:  # kind, status, times: ingestion stores them, wrongly (UNSPECIFIED, UNSET, 1970 or 2554)
            assert table.num_rows == 1


# --- one big valid request does not stall the others --------------------------------------------

REWARD_EVENTS = 60_000  # 2.9 MB
TRACES = 100_000  # one span each, 5.6 MB
HEALTH_WITHIN_S = 0.5


def _health_while(server: CollectorServer, call: Any) -> tuple[list[float], float]:
    """Run ``call`` (one big request) on a thread; from the moment the collector has its body until
    it answers, time GET /health on another connection. Returns the latencies and the request's time."""
    done = threading.Event()
    took: list[float] = []
    requests = server.collector.stats.requests

    def big() -> None:
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
        done.set()

    thread = threading.Thread(target=big)
    latencies: list[float] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=120) as other:
        assert other.get("/health").status_code == 200  # connected before the big request starts
        thread.start()
        while server.collector.stats.requests == requests and not done.is_set():
            time.sleep(0.005)  # the body is still on its way
        while not done.is_set():
            started = time.perf_counter()
            assert other.get("/health").status_code == 200
            if not done.is_set():
                latencies.append(time.perf_counter() - started)
            time.sleep(0.02)
    thread.join()
    return latencies, took[0]


def test_big_reward_body_does_not_stall_health(server: CollectorServer, sink: MemorySink) -> None:
    events = [{"value": i % 7 / 7, "rollout_id": f"big-{i}", "event_id": f"e{i}"} for i in range(REWARD_EVENTS)]
    body = json.dumps(events).encode()
    before = len(sink.records)
    answers: list[httpx.Response] = []

    def post() -> None:
        url = f"http://127.0.0.1:{server.http_port}/v1/rewards"
        answers.append(httpx.post(url, content=body, headers=JSON, timeout=300))

    latencies, took = _health_while(server, post)
    assert answers[0].status_code == 200 and answers[0].json() == {"accepted": len(events)}
    assert len(sink.records) - before == len(events)
    print(f"rewards: {len(body) / 1e6:.1f} MB in {took:.2f}s; /health max {max(latencies, default=0):.3f}s")
    assert latencies, f"the big request took {took:.2f}s: too short to show anything"
    assert max(latencies) < HEALTH_WITHIN_S, latencies


def test_big_trace_body_does_not_stall_health(server: CollectorServer, sink: MemorySink) -> None:
    """Many one-span traces over gRPC: decoding and splitting into one record each is the slow part."""
    body = request(*(span() for _ in range(TRACES))).SerializeToString()
    before = len(sink.records)
    answers: list[bytes] = []

    def export() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            answers.append(channel.unary_unary(EXPORT)(body, timeout=300))

    latencies, took = _health_while(server, export)
    assert ExportTraceServiceResponse.FromString(answers[0]) == ExportTraceServiceResponse()
    assert len(sink.records) - before == TRACES
    print(f"traces: {len(body) / 1e6:.1f} MB in {took:.2f}s; /health max {max(latencies, default=0):.3f}s")
    assert latencies, f"the big request took {took:.2f}s: too short to show anything"
    assert max(latencies) < HEALTH_WITHIN_S, latencies
