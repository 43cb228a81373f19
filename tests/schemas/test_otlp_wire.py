"""Requests built from the encodings of their parts are what protobuf itself writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from schemas.otlp import wire


@given(st.integers(0, 2**64 - 1))
def test_varint_is_base_128(n: int) -> None:
    encoded = wire.varint(n)
    assert len(encoded) == max(1, (n.bit_length() + 6) // 7) and encoded[-1] < 0x80
    assert sum((b & 0x7F) << (7 * i) for i, b in enumerate(encoded)) == n


@st.composite
def requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for r in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add(schema_url=draw(st.sampled_from(["", "https://s/1"])))
        if draw(st.booleans()):
            rs.resource.attributes.add(key="service.name").value.string_value = f"svc-{r}"
        for s in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add(schema_url=draw(st.sampled_from(["", "https://s/2"])))
            if draw(st.booleans()):
                ss.scope.name = f"scope-{s}"
            for k in range(draw(st.integers(0, 3))):
                ss.spans.add(
                    trace_id=bytes([k + 1]) * 16, span_id=bytes([s + 1]) * 8, name="x" * draw(st.integers(0, 200))
                )
    return req


@given(requests())
def test_a_request_rebuilt_from_its_parts_is_the_request(req: ExportTraceServiceRequest) -> None:
    """The same message; the same bytes too, but where a scope has a schema URL (written before its spans)."""
    rebuilt = b"".join(
        wire.resource_spans(
            wire.resource_head(rs),
            [wire.scope_spans(wire.scope_head(ss), [s.SerializeToString() for s in ss.spans]) for ss in rs.scope_spans],
            wire.resource_tail(rs),
        )
        for rs in req.resource_spans
    )
    assert ExportTraceServiceRequest.FromString(rebuilt) == req
    if not any(ss.schema_url for rs in req.resource_spans for ss in rs.scope_spans):
        assert rebuilt == req.SerializeToString()
