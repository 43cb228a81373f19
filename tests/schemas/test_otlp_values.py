"""AnyValue as Python: the real messages and the lite view read the same, and as protobuf's JSON says."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from schemas.otlp.lite import ExportTraceServiceRequestLite
from schemas.otlp.values import any_value, lite_value

_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda v: AnyValue(int_value=v)),
    st.floats(allow_nan=False).map(lambda v: AnyValue(double_value=v)),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=10).map(lambda v: AnyValue(string_value=v)),
    st.booleans().map(lambda v: AnyValue(bool_value=v)),
    st.binary(max_size=6).map(lambda v: AnyValue(bytes_value=v)),
    st.just(AnyValue()),
)
any_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
        st.lists(st.tuples(st.text(max_size=5), inner), max_size=3).map(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs]))
        ),
    ),
    max_leaves=10,
)


def _from_json(d: dict[str, Any]) -> Any:
    """protobuf's JSON of an AnyValue, in the reading ``any_value`` promises (bytes as hex, empty as None)."""
    if not d:
        return None
    ((kind, v),) = d.items()
    if kind == "arrayValue":
        return [_from_json(x) for x in v.get("values", [])]
    if kind == "kvlistValue":
        out = {}
        for kv in v.get("values", []):
            out[kv["key"] if "key" in kv else ""] = _from_json(kv.get("value", {}))
        return out
    if kind == "bytesValue":
        return json_format.base64.b64decode(v).hex()
    if kind == "intValue":
        return int(v)
    if kind == "doubleValue":
        return float(v)  # JSON spells infinities as strings
    return v


@given(any_values)
def test_any_value_reads_what_protobuf_json_says(v: AnyValue) -> None:
    assert any_value(v) == _from_json(json_format.MessageToDict(v))


@given(st.lists(any_values, min_size=1, max_size=4))
def test_lite_view_reads_as_the_real_messages(values: list[AnyValue]) -> None:
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add(name="s")
    span.attributes.extend([KeyValue(key=str(i), value=v) for i, v in enumerate(values)])
    lite = ExportTraceServiceRequestLite.FromString(req.SerializeToString())
    (lite_span,) = lite.resource_spans[0].scope_spans[0].spans
    assert [lite_value(kv.value) for kv in lite_span.attributes] == [any_value(v) for v in values]
    assert lite.SerializeToString() == req.SerializeToString()  # the view loses nothing
