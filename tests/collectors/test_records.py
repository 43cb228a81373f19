"""Pure decoding: OTLP protobuf/JSON -> one record per trace, losslessly; reward events."""

from __future__ import annotations

import gzip
import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from collectors.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from collectors.records import (
    body_format,
    decode_traces,
    decompress,
    encode_response,
    reward_records,
    split_traces,
)
from schemas import attributes, topics


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def make_request(
    traces: dict[bytes, int], *, resources: int = 1, rollout_on: str | None = None
) -> ExportTraceServiceRequest:
    """``resources`` resources, each with two scopes, spreading spans of ``traces`` over them."""
    req = ExportTraceServiceRequest()
    n = 0
    for r in range(resources):
        rs = req.resource_spans.add()
        rs.resource.attributes.append(kv("service.name", f"svc-{r}"))
        rs.schema_url = "https://opentelemetry.io/schemas/1.21.0"
        if rollout_on == "resource":
            rs.resource.attributes.append(kv(attributes.ROLLOUT_ID, f"rollout-{r}"))
        for s in range(2):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope-{s}"
            ss.scope.version = "1.0"
            for tid, count in traces.items():
                for _ in range(count):
                    n += 1
                    span = ss.spans.add()
                    span.trace_id = tid
                    span.span_id = n.to_bytes(8, "big")
                    span.name = f"span-{n}"
                    span.start_time_unix_nano = 1_700_000_000_000_000_000 + n
                    if rollout_on == "span" and n % 3 == 0:
                        span.attributes.append(kv(attributes.AGL_ROLLOUT_ID, f"agl-{tid.hex()[:4]}"))
    return req


T1, T2, T3 = (bytes([i]) * 16 for i in (1, 2, 3))


def test_split_one_record_per_trace_keeps_resource_and_scope() -> None:
    req = make_request({T1: 2, T2: 3, T3: 1}, resources=2)
    split = split_traces(req, tenant="acme", topic="spans", received_at_ns=123)
    assert split.accepted_spans == 2 * 2 * 6 and split.rejected_spans == 0
    assert sorted(r.key for r in split.records) == sorted(t.hex().encode() for t in (T1, T2, T3))
    regathered: dict[str, list[tuple[str, str, str]]] = {}
    for rec in split.records:
        part = ExportTraceServiceRequest.FromString(rec.value)
        assert rec.spans == sum(len(ss.spans) for rs in part.resource_spans for ss in rs.scope_spans)
        assert {s.trace_id for rs in part.resource_spans for ss in rs.scope_spans for s in ss.spans} == {
            bytes.fromhex(rec.key.decode())
        }
        for rs in part.resource_spans:
            assert rs.schema_url == "https://opentelemetry.io/schemas/1.21.0"
            for ss in rs.scope_spans:
                for s in ss.spans:
                    svc = rs.resource.attributes[0].value.string_value
                    regathered.setdefault(s.span_id.hex(), []).append((svc, ss.scope.name, s.name))
        headers = dict(rec.headers)
        assert headers[topics.HEADER_TENANT] == b"acme"
        assert headers[topics.HEADER_RECEIVED_AT] == b"123"
        assert headers[topics.HEADER_CONTENT_TYPE] == topics.SPANS_CONTENT_TYPE.encode()
    # every span exactly once, with its own resource and scope
    original = {
        s.span_id.hex(): [(rs.resource.attributes[0].value.string_value, ss.scope.name, s.name)]
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    assert regathered == original


def test_split_is_lossless_for_unknown_and_rich_fields() -> None:
    req = make_request({T1: 1})
    span = req.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.append(KeyValue(key="n", value=AnyValue(int_value=7)))
    span.events.add(name="ev", time_unix_nano=5)
    span.links.add(trace_id=T2, span_id=b"\x09" * 8)
    split = split_traces(req, tenant="t", topic="spans", received_at_ns=1)
    (rec,) = split.records
    assert ExportTraceServiceRequest.FromString(rec.value) == req


def test_single_trace_protobuf_body_is_reused_unchanged() -> None:
    body = make_request({T1: 4}).SerializeToString()
    split = split_traces(decode_traces(body, "protobuf"), tenant="t", topic="s", received_at_ns=1, original=body)
    assert [r.value for r in split.records] == [body]


@pytest.mark.parametrize("where", ["resource", "span"])
def test_key_is_the_trace_id_whatever_rollout_id_the_spans_carry(where: str) -> None:
    """Pieces of one trace land in one partition even when only a later piece names the rollout."""
    req = make_request({T1: 3, T2: 3}, rollout_on=where)
    keys = {r.key for r in split_traces(req, tenant="t", topic="s", received_at_ns=1).records}
    assert keys == {T1.hex().encode(), T2.hex().encode()}


def test_invalid_ids_are_rejected_as_partial_success() -> None:
    req = make_request({T1: 2})
    bad = req.resource_spans[0].scope_spans[0].spans.add(name="bad", trace_id=b"\x01\x02", span_id=b"\x01" * 8)
    req.resource_spans[0].scope_spans[0].spans.add(name="zero", trace_id=bytes(16), span_id=b"\x01" * 8)
    split = split_traces(req, tenant="t", topic="s", received_at_ns=1, original=req.SerializeToString())
    assert split.rejected_spans == 2 and split.accepted_spans == 4
    assert "trace_id" in split.error_message and bad.name in split.error_message
    resp = json.loads(encode_response("json", split.rejected_spans, split.error_message))
    assert resp["partialSuccess"]["rejectedSpans"] == "2"


def test_otlp_json_uses_hex_ids() -> None:
    req = make_request({T1: 1, T2: 1})
    req.resource_spans[0].scope_spans[0].spans[0].parent_span_id = b"\xab" * 8
    req.resource_spans[0].scope_spans[0].spans[0].links.add(trace_id=T3, span_id=b"\xcd" * 8)
    data = json_format.MessageToDict(req)
    # turn protobuf's base64 into OTLP's hex, as real OTLP/JSON senders do
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = json_format.base64.b64decode(s[k]).hex()
                for link in s.get("links", []):
                    link["traceId"] = json_format.base64.b64decode(link["traceId"]).hex()
                    link["spanId"] = json_format.base64.b64decode(link["spanId"]).hex()
    assert data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == T1.hex()
    data["someFutureField"] = 1  # OTLP receivers must ignore unknown fields
    assert decode_traces(json.dumps(data).encode(), "json") == req


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{", "not valid JSON"),
        (b"[]", "top level"),
        (b'{"resourceSpans": {}}', "expected a list"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}', "hex"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 5}]}]}]}', "OTLP JSON"),
    ],
)
def test_bad_json_says_what_is_wrong(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        decode_traces(body, "json")


def test_bad_protobuf_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="protobuf"):
        decode_traces(b"\x0a\xff\xff\xff", "protobuf")


def test_content_type_and_encoding() -> None:
    assert body_format("application/x-protobuf") == "protobuf"
    assert body_format("application/json; charset=utf-8") == "json"
    with pytest.raises(UnsupportedMediaType):
        body_format("text/plain")
    assert decompress(gzip.compress(b"x" * 100), "gzip", limit=1000) == b"x" * 100
    with pytest.raises(PayloadTooLarge):
        decompress(gzip.compress(b"x" * 5000), "gzip", limit=1000)  # a small zip bomb
    with pytest.raises(BadRequest, match="truncated"):
        decompress(gzip.compress(b"x" * 100)[:-10], "gzip", limit=1000)
    with pytest.raises(UnsupportedMediaType):
        decompress(b"", "br", limit=10)


def test_reward_records_validate_and_stamp_tenant() -> None:
    body = json.dumps([{"value": 1, "rollout_id": "r1"}, {"value": 0.5, "trace_id": T1.hex().upper()}]).encode()
    recs = reward_records(body, tenant="acme", topic="rewards", received_at_ns=1_700_000_000_000_000_000)
    assert [r.key for r in recs] == [b"r1", T1.hex().encode()]
    first = json.loads(recs[0].value)
    assert first["tenant"] == "acme" and first["name"] == "primary" and first["timestamp"].startswith("2023-11-14")
    assert dict(recs[0].headers)[topics.HEADER_TENANT] == b"acme"
    with pytest.raises(BadRequest, match=r"\[1\]\.value"):
        reward_records(
            b'[{"value": 1, "rollout_id": "a"}, {"rollout_id": "b"}]', tenant="t", topic="r", received_at_ns=1
        )
    with pytest.raises(BadRequest, match="rollout"):
        reward_records(b'{"value": 1}', tenant="t", topic="r", received_at_ns=1)
    with pytest.raises(BadRequest, match="tenant"):
        reward_records(b'{"value": 1, "rollout_id": "a", "tenant": "other"}', tenant="t", topic="r", received_at_ns=1)
