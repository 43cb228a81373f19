"""Malformed, truncated, oversized, wrongly typed and hostile bodies: never a crash, never a 5xx.

10,000 generated bodies (2,500 each: OTLP/HTTP protobuf, OTLP/HTTP JSON, OTLP/gRPC, /v1/rewards),
property-based on top of a corpus of the cases issue 11 found. Between them, every 8th call sends a
valid request on the same connection; the last test checks that every one of those is stored, that
what the collector acknowledged is exactly what the sink holds, that ingestion quarantines none of
it, that the server still answers, and that the process's memory came back near where it started.

The receivers run on an in-memory sink (decoding and HTTP/gRPC handling are what is under test,
and thousands of Kafka round trips would only slow the search down).
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import psutil
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collectors.sink import MemorySink
from pipelines.bronze.decoding import KafkaRecord, decode_reward_event, decode_spans
from schemas import attributes as A
from schemas import span_checks
from schemas.config import Settings, load_settings
from tests.collectors.helpers import running_collector

# per entry point: 10,000 bodies in all (`make test-fast` sets fewer)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "2500"))
# one collector and one ledger for the whole campaign: the last test checks what every other test sent,
# so under `pytest -n N` the module's tests stay on one worker
pytestmark = pytest.mark.xdist_group("collector-fuzz")
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMIT = 4096  # collector.max_body_bytes here: small, so that the limit is fuzzed too
VALID_EVERY = 8
MEMORY_SLACK = 32 << 20  # allocator arenas and caches; a leak of a few KB per body would be 40+ MB
NOW_NS = 1_750_000_000_000_000_000
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
PROTOBUF = "application/x-protobuf"


def _valid_request(trace_id: bytes = b"\x01" * 16) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(3):
        s = ss.spans.add(
            trace_id=trace_id, span_id=(i + 1).to_bytes(8, "big"), name=f"s{i}", start_time_unix_nano=NOW_NS + i
        )
        s.attributes.add(key="k", value={"string_value": "v" * i})
    s.attributes.add(key=A.LLM_PROMPT_TOKEN_IDS, value=AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=7)])))
    return req


VALID = _valid_request().SerializeToString()

# --- the corpus: what issue 11 found, as bodies --------------------------------------------------


def _json_span(**patch: Any) -> bytes:
    s = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x", "startTimeUnixNano": str(NOW_NS), **patch}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}).encode()


def _pb_span(**fields: Any) -> bytes:
    attrs = fields.pop("attrs", {})
    base = {"trace_id": b"\xab" * 16, "span_id": b"\xcd" * 8, "name": "x", "start_time_unix_nano": NOW_NS}
    s = Span(**{**base, **fields})
    for k, v in attrs.items():
        s.attributes.add(key=k, value=v)
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.append(s)
    return req.SerializeToString()


def _ints(*v: int) -> AnyValue:
    return AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=x) for x in v]))


CORPUS_REWARDS = [
    b'{"value": 1' + b"0" * 400 + b', "rollout_id": "r"}',
    b'{"value": 1, "rollout_id": "r", "timestamp": "0001-01-01T00:00:00+01:00"}',
    b'{"value": 1, "rollout_id": "r", "timestamp": "9999-12-31T23:59:59-23:59"}',
    b'{"value": 1, "rollout_id": "\\ud800"}',
    b'{"value": 1, "rollout_id": "r", "\\udfff": 1}',
    b'{"value": 1, "rollout_id": "\xed\xa0\x80"}',
    b'{"value": 1e400, "rollout_id": "r"}',
    b'{"value": 1, "rollout_id": "r", "timestamp": 18446744073709551615}',
    b"[" * 100_000,
]
CORPUS_JSON = [
    _json_span(name="\ud800"),  # json.dumps writes it as the escape \\ud800
    _json_span(kind="\ud800"),  # protobuf's parser: SystemError
    _json_span(**{"\udfff": 1}),
    _json_span(attributes=[{"key": "k", "value": {"doubleValue": "\ud800"}}]),  # quoted in its error message
    _json_span(kind="NOPE"),
    _json_span(kind=99),
    _json_span(status={"code": "STATUS_CODE_NOPE"}),
    _json_span(status={"code": 9}),
    _json_span(startTimeUnixNano="0"),
    _json_span(startTimeUnixNano=str(2**64 - 1)),
    _json_span(startTimeUnixNano=str(2**64)),
    _json_span(attributes=[{"key": A.LLM_PROMPT_TOKEN_IDS, "value": {"stringValue": "[-1]"}}]),
]
CORPUS_PROTOBUF = [
    _pb_span(kind=99),
    _pb_span(start_time_unix_nano=0),
    _pb_span(start_time_unix_nano=2**64 - 1),
    _pb_span(attrs={A.LLM_PROMPT_TOKEN_IDS: _ints(-1)}),
    _pb_span(attrs={A.LLM_COMPLETION_TOKEN_IDS: _ints(2**31)}),
    _pb_span(attrs={A.LLM_COMPLETION_LOGPROBS: AnyValue(string_value="nope")}),
    _pb_span(name=A.REWARD_SPAN_NAME, attrs={A.REWARD_VALUE: AnyValue(string_value="high")}),
    VALID,
]

# --- generated structures -------------------------------------------------------------------------

_texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda v: AnyValue(int_value=v)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda v: AnyValue(double_value=v)),
    _texts.map(lambda v: AnyValue(string_value=v)),
    st.sampled_from(["[1, 2]", "[-1]", "[2147483648]", "[1.5]", "[]", "", "nan", "0.5", "{"]).map(
        lambda v: AnyValue(string_value=v)
    ),
    st.booleans().map(lambda v: AnyValue(bool_value=v)),
    st.binary(max_size=8).map(lambda v: AnyValue(bytes_value=v)),
    st.just(AnyValue()),
)
any_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5).map(lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
        st.lists(st.tuples(_texts, inner), max_size=3).map(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs]))
        ),
    ),
    max_leaves=12,
)
attribute_keys = (
    st.sampled_from(sorted(span_checks.CHECKED_KEYS) + ["k", A.ROLLOUT_ID, A.GEN_AI_INPUT_MESSAGES]) | _texts
)
times = st.sampled_from([0, 1, NOW_NS, 2**63, 2**64 - 1, span_checks.MIN_TIME_NS, span_checks.MAX_TIME_NS]) | (
    st.integers(0, 2**64 - 1)
)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    s = Span(
        trace_id=draw(st.sampled_from([b"\x0f" * 16, b"\x0e" * 16, bytes(16)]) | st.binary(max_size=17)),
        span_id=draw(st.sampled_from([b"\x01" * 8, b"\x02" * 8]) | st.binary(max_size=9)),
        name=draw(st.sampled_from(["llm", A.REWARD_SPAN_NAME, A.AGL_REWARD_SPAN_NAME]) | _texts),
        kind=draw(st.integers(-3, 8)),
        start_time_unix_nano=draw(times),
        end_time_unix_nano=draw(times),
    )
    s.status.code = draw(st.integers(-2, 5))
    for key, value in draw(st.lists(st.tuples(attribute_keys, any_values), max_size=4)):
        s.attributes.add(key=key, value=value)
    return s


@st.composite
def otlp_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add()
        for key, value in draw(st.lists(st.tuples(attribute_keys, any_values), max_size=2)):
            rs.resource.attributes.add(key=key, value=value)
        for _ in range(draw(st.integers(0, 2))):
            rs.scope_spans.add().spans.extend(draw(st.lists(spans(), max_size=3)))
    return req


def _mutate(data: bytes, cut: int, flips: dict[int, int]) -> bytes:
    data = data[: cut % (len(data) + 1)]
    return bytes(b ^ flips.get(i, 0) for i, b in enumerate(data))


mutations = st.tuples(st.integers(0, 10_000), st.dictionaries(st.integers(0, 400), st.integers(1, 255), max_size=4))
protobuf_bodies = st.one_of(
    st.binary(max_size=300),
    st.sampled_from(CORPUS_PROTOBUF),
    otlp_requests().map(lambda r: r.SerializeToString()),
    st.tuples(st.sampled_from(CORPUS_PROTOBUF), mutations).map(lambda t: _mutate(t[0], *t[1])),
    st.tuples(otlp_requests(), mutations).map(lambda t: _mutate(t[0].SerializeToString(), *t[1])),
)

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
        "intValue",
        "arrayValue",
        "kind",
        "status",
        "code",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "rollout_id",
        "trace_id",
    ]
)
otlp_like = st.recursive(
    st.none()
    | st.integers()
    | st.text(max_size=34)
    | st.sampled_from(["ab" * 16, "cd" * 8, "zz", "SPAN_KIND_SERVER", "NOPE", "\ud800", str(2**64 - 1)]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(otlp_keys, inner, max_size=4),
    max_leaves=25,
)


def _hex_json(req: ExportTraceServiceRequest) -> dict[str, Any]:
    data = json_format.MessageToDict(req)
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for k in ("traceId", "spanId"):
                    if k in s:
                        s[k] = json_format.base64.b64decode(s[k]).hex()
    return data


@st.composite
def patched_otlp_json(draw: st.DrawFn) -> bytes:
    """A generated request as OTLP/JSON, with one span field set to something odd."""
    data = _hex_json(draw(otlp_requests()))
    found = [s for rs in data.get("resourceSpans", []) for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])]
    if found and draw(st.booleans()):
        target = draw(st.sampled_from(found))
        target[draw(otlp_keys)] = draw(otlp_like)
    return json.dumps(data, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


json_bodies = st.one_of(
    st.sampled_from(CORPUS_JSON),
    json_values.map(lambda v: json.dumps(v).encode()),
    otlp_like.map(lambda v: json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [v]}]}]}).encode()),
    otlp_like.map(lambda v: json.dumps(v).encode()),
    patched_otlp_json(),
    st.tuples(patched_otlp_json(), mutations).map(lambda t: _mutate(t[0], *t[1])),
)

reward_like = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "value": json_values
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.integers(min_value=-(10**500), max_value=10**500),
            "rollout_id": json_values | st.sampled_from(["\ud800", "r\udfff", "ok"]),
            "trace_id": st.text(max_size=40) | json_values,
            "response_id": json_values,
            "name": json_values,
            "timestamp": json_values
            | st.sampled_from(
                [
                    "2024-01-01T00:00:00Z",
                    "2024-01-01",
                    "yesterday",
                    "0001-01-01T00:00:00+01:00",
                    "9999-12-31T23:59:59-05:00",
                    "2024-01-01T00:00:00",
                ]
            )
            | st.integers(-(2**70), 2**70),
            "tenant": json_values,
            "event_id": json_values,
            "extra": json_values,
        },
    ),
)
reward_bodies = st.one_of(
    st.sampled_from(CORPUS_REWARDS),
    st.binary(max_size=100),
    st.one_of(reward_like, st.lists(reward_like, max_size=3)).map(
        lambda v: json.dumps(v).encode("utf-8", "surrogatepass")
    ),
)
encodings = st.sampled_from([None, None, None, "gzip", "gzip-truncated", "gzip-2-members", "deflate"])
json_types = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", ""])
protobuf_types = st.sampled_from([PROTOBUF, PROTOBUF, "application/protobuf", "multipart/form-data"])


def encode(body: bytes, how: str | None) -> tuple[bytes, dict[str, str]]:
    if how == "gzip":
        return gzip.compress(body), {"content-encoding": "gzip"}
    if how == "gzip-truncated":
        return gzip.compress(body)[:-5], {"content-encoding": "gzip"}
    if how == "gzip-2-members":
        half = len(body) // 2
        return gzip.compress(body[:half]) + gzip.compress(body[half:]), {"content-encoding": "gzip"}
    if how == "deflate":
        return body, {"content-encoding": "deflate"}
    return body, {}


# --- the server and what the run must leave behind --------------------------------------------------


@dataclass
class Ledger:
    """The valid requests sent between the hostile ones, and the process's memory at the start."""

    rss_start: int = 0
    calls: int = 0
    traces: set[str] = field(default_factory=set)
    rewards: set[str] = field(default_factory=set)
    bodies: int = 0
    started: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        self.calls += 1
        return self.calls % VALID_EVERY == 0

    def next_trace(self) -> bytes:
        trace = (0xF0 << 120 | len(self.traces) + 1).to_bytes(16, "big")
        self.traces.add(trace.hex())
        return trace


@dataclass
class Served:
    """The collector under test, in a process of its own: its memory is measured apart from
    hypothesis's, and generating bodies here runs beside serving them there (two cores)."""

    http_port: int
    grpc_port: int
    rewards_topic: str
    conn: Any
    pid: int

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        return self.conn.recv()


def serve(conn: Any, limit: int) -> None:
    """The child process: a collector on a MemorySink; answers ``rss``, ``books`` and ``stop``."""
    s: Settings = load_settings(environ={}, overrides={"collector": {"max_body_bytes": limit}})
    sink = MemorySink()
    with running_collector(s, sink) as srv:
        conn.send((srv.http_port, srv.grpc_port, s.kafka.rewards_topic))
        while (command := conn.recv()) != "stop":
            gc.collect()
            rss = psutil.Process().memory_info().rss
            if command == "rss":
                conn.send(rss)
            else:
                records = [(r.topic, r.key, r.value, r.headers, r.spans) for r in sink.records]
                conn.send((dataclasses.asdict(srv.collector.stats), records, rss))
    conn.send("stopped")


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(theirs, LIMIT), daemon=True)
    proc.start()
    try:
        assert ours.poll(120), "the collector process did not start"
        http_port, grpc_port, rewards_topic = ours.recv()
        served = Served(http_port, grpc_port, rewards_topic, ours, proc.pid)
        yield served
        assert served.ask("stop") == "stopped"
        proc.join(30)
        assert proc.exitcode == 0, "the collector process crashed"
    finally:
        if proc.is_alive():
            proc.kill()


@pytest.fixture(scope="module")
def client(server: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def channel(server: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch


@pytest.fixture(scope="module")
def ledger(server: Served, client: httpx.Client, channel: grpc.Channel) -> Ledger:
    """Taken after one request of each kind, so the server's one-time allocations are made."""
    assert client.get("/health").status_code == 200
    assert client.post("/v1/traces", content=VALID, headers={"content-type": PROTOBUF}).status_code == 200
    assert client.post("/v1/rewards", json={"value": 1, "rollout_id": "warm"}).status_code == 200
    assert client.post("/v1/traces", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    channel.unary_unary(EXPORT)(VALID, timeout=30)
    return Ledger(rss_start=server.ask("rss"))


def with_corpus(corpus: list[bytes], **fixed: Any) -> Any:
    """Every body of ``corpus`` as an explicit example (always run, first), besides the generated ones."""

    def decorate(test: Any) -> Any:
        for body in reversed(corpus):
            test = example(body=body, **fixed)(test)
        return test

    return decorate


def _local_port(r: httpx.Response) -> int:
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def _assert_answered(r: httpx.Response) -> None:
    assert r.status_code in (200, 400, 413, 415), (r.status_code, r.text[:300])
    if r.status_code != 200:
        assert r.content, "an error answer must say what is wrong"


def _interleave_valid(client: httpx.Client, ledger: Ledger, after: httpx.Response) -> None:
    """Every VALID_EVERY-th call: a valid export on the same connection (kept alive after a 400)."""
    ledger.bodies += 1
    if not ledger.due():
        return
    body = _valid_request(ledger.next_trace()).SerializeToString()
    ok = client.post("/v1/traces", content=body, headers={"content-type": PROTOBUF})
    assert ok.status_code == 200, ok.text
    if after.status_code in (200, 400):  # 413/415 answer before reading the body: closing is allowed
        assert _local_port(ok) == _local_port(after), "the connection did not survive the hostile request"


@FUZZ
@with_corpus(CORPUS_PROTOBUF, ctype=PROTOBUF, how=None)
@given(body=protobuf_bodies, ctype=protobuf_types, how=encodings)
def test_http_protobuf_never_5xx(client: httpx.Client, ledger: Ledger, body: bytes, ctype: str, how: str) -> None:
    content, headers = encode(body, how)
    r = client.post("/v1/traces", content=content, headers={"content-type": ctype, **headers})
    _assert_answered(r)
    _interleave_valid(client, ledger, r)


@FUZZ
@with_corpus(CORPUS_JSON, ctype="application/json", how=None)
@given(body=json_bodies, ctype=json_types, how=encodings)
def test_http_json_never_5xx(client: httpx.Client, ledger: Ledger, body: bytes, ctype: str, how: str) -> None:
    content, headers = encode(body, how)
    r = client.post("/v1/traces", content=content, headers={"content-type": ctype, **headers})
    _assert_answered(r)
    _interleave_valid(client, ledger, r)


@FUZZ
@with_corpus(CORPUS_REWARDS, how=None)
@given(body=reward_bodies, how=encodings)
def test_http_rewards_never_5xx(client: httpx.Client, ledger: Ledger, body: bytes, how: str) -> None:
    content, headers = encode(body, how)
    r = client.post("/v1/rewards", content=content, headers={"content-type": "application/json", **headers})
    _assert_answered(r)
    _interleave_valid(client, ledger, r)


# grpc itself answers a message over the limit, in 120-950 ms each here: one body in 50
oversized = st.binary(min_size=LIMIT + 1, max_size=LIMIT + 2000)
grpc_bodies = st.integers(0, 49).flatmap(lambda n: oversized if n == 49 else protobuf_bodies)


@FUZZ
@with_corpus(CORPUS_PROTOBUF)
@given(body=grpc_bodies)
def test_grpc_never_internal(channel: grpc.Channel, ledger: Ledger, body: bytes) -> None:
    export = channel.unary_unary(EXPORT)
    try:
        export(body, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), exc
        assert exc.details()
    ledger.bodies += 1
    if ledger.due():
        assert export(_valid_request(ledger.next_trace()).SerializeToString(), timeout=30) is not None


def test_still_healthy_and_oversized(client: httpx.Client) -> None:
    ok = client.post("/v1/traces", content=VALID, headers={"content-type": PROTOBUF})
    assert ok.status_code == 200
    r = client.post("/v1/traces", content=b"\x00" * 5000, headers={"content-type": PROTOBUF})
    assert r.status_code == 413
    bomb = gzip.compress(b"\x00" * 1_000_000)
    r = client.post("/v1/traces", content=bomb, headers={"content-type": PROTOBUF, "content-encoding": "gzip"})
    assert r.status_code == 413
    assert client.get("/health").status_code == 200


def test_everything_acknowledged_is_stored_and_memory_came_back(server: Served, ledger: Ledger) -> None:
    """Runs last: the books of the whole fuzz run, and the collector process's memory."""
    assert ledger.bodies >= 4 * EXAMPLES, ledger.bodies
    stats, records, rss = server.ask("books")
    span_records = [r for r in records if r[4]]
    reward_records = [r for r in records if r[0] == server.rewards_topic]
    # acknowledged = stored, but for retries of a body already stored (answered, not written twice)
    assert sum(r[4] for r in span_records) == stats["stored_spans"] <= stats["acknowledged_spans"]
    assert len(reward_records) == stats["stored_rewards"] <= stats["acknowledged_rewards"]
    stored = {r[1].decode() for r in span_records}
    assert ledger.traces <= stored, f"{len(ledger.traces - stored)} acknowledged valid traces are missing"
    # nothing acknowledged is something ingestion would quarantine
    kafka = [KafkaRecord(topic, 0, i, key, value, headers) for i, (topic, key, value, headers, _) in enumerate(records)]
    table, quarantine = decode_spans([k for k, r in zip(kafka, records, strict=True) if r[4]])
    assert not quarantine, quarantine[:3]
    assert table.num_rows == stats["stored_spans"]
    for k in kafka:
        if k.topic == server.rewards_topic:
            decode_reward_event(k)
    kept = sum(len(r[2]) + len(r[1] or b"") for r in records)
    grown = rss - ledger.rss_start
    print(
        f"fuzz: {ledger.bodies} bodies, {len(ledger.traces)} valid requests interleaved, "
        f"{len(records)} records stored ({kept / 1e6:.1f} MB), collector RSS {ledger.rss_start / 1e6:.0f} MB "
        f"-> {rss / 1e6:.0f} MB ({grown / 1e6:+.1f}), {time.monotonic() - ledger.started:.0f}s"
    )
    assert grown - kept < MEMORY_SLACK, f"the collector's RSS grew by {grown / 1e6:.0f} MB beyond what it stores"
