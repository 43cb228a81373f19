"""An OTLP ``AnyValue`` as plain Python: one reading for the collector's checks and the pipeline's rows.

Strings, ints, floats and bools as themselves, arrays as lists, kvlists as dicts, bytes as hex, an
empty value as None (what ``schemas.span_checks`` expects, and what lands in the `spans` table).
``lite_value`` reads the lite view (``schemas.otlp.lite``), whose arrays and kvlists are still bytes:
they are parsed straight into their messages, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValueList

# Scalar kinds an array is read by at C speed: a field holds its default ("", 0, 0.0, False) when
# another one of the oneof is set, so only items that read as a default need another look.
_READ_SCALAR: dict[str | None, attrgetter[Any]] = {
    kind: attrgetter(kind) for kind in ("string_value", "int_value", "double_value", "bool_value")
}


def any_value(v: AnyValue) -> Any:
    """``v`` as plain Python (bytes as hex, an empty value as None)."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return _items(v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return None


def lite_value(v: Any) -> Any:
    """An ``AnyValue`` of the lite view, read as ``any_value`` reads the real message."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return _items(ArrayValue.FromString(v.array_value).values)
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in KeyValueList.FromString(v.kvlist_value).values}
    return any_value(v)


def _items(values: Sequence[AnyValue]) -> list[Any]:
    """Array items as ``any_value`` reads each; arrays of one scalar kind without a call per item."""
    if not values:
        return []
    read = _READ_SCALAR.get(values[0].WhichOneof("value"))
    if read is None:
        return [any_value(x) for x in values]
    out = list(map(read, values))
    if not all(out):
        for i, x in enumerate(out):
            if not x:
                out[i] = any_value(values[i])
    return out
