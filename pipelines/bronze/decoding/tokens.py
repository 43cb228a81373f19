"""The token columns of `spans`: prompt ids, completion ids and logprobs, as Arrow list columns.

Arrays under the token keys are kept in wire form (``PackedArray``) while a batch is read, and decoded
batch-wide in one numpy pass (``schemas.otlp.packed``). What the pass refuses is read one by one and
checked by ``schemas.span_checks``' rules, the collector's, so a record is refused with its words.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import ArrayValue

from schemas import span_checks
from schemas.otlp import packed
from schemas.otlp.values import any_value
from schemas.tables import SPANS

TOKEN_COLUMNS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")


class PackedArray:
    """A token-id or logprob array kept as the ``ArrayValue`` bytes it arrived in."""

    __slots__ = ("data", "record", "key")

    def __init__(self, data: bytes, record: int, key: str) -> None:
        self.data = data
        self.record = record  # the record it came from, quarantined if the array is refused
        self.key = key  # the attribute it came from, named in a quarantine reason

    def items(self) -> list[Any]:
        """The items one by one, for anything the batch pass refused.

        The first item's kind reads the whole array, as ingestion always has: in an array of doubles
        a later int reads as 0.0, in an array of ints a later bool as 0.
        """
        values = ArrayValue.FromString(self.data).values
        if not values:
            return []
        first = values[0].WhichOneof("value")
        if first == "int_value":
            return [x.int_value for x in values]
        if first == "double_value":
            return [x.double_value for x in values]
        if first == "string_value":
            return [x.string_value for x in values]
        return [any_value(x) for x in values]


def _as_items(v: Any) -> Any:
    """``v`` as ``schemas.span_checks`` reads it: a JSON string parsed when it parses, arrays as lists."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except (ValueError, RecursionError):
            return v  # the check names it: not a JSON list
    return v.tolist() if isinstance(v, np.ndarray) else v


def _checked(v: Any, key: str, problem: Callable[[Any], str | None]) -> Any:  # noqa: ANN401 - a list or packed
    """``v`` as items (a packed array as it is), or a ``ValueError`` naming ``key`` and what ``problem`` found."""
    if v is None or v.__class__ is PackedArray:
        return v
    items = _as_items(v)
    if (why := problem(items)) is not None:
        raise ValueError(f"attributes[{key}]: {why}")
    return items


def token_ids(v: Any, key: str) -> np.ndarray | PackedArray | None:
    """Token ids of attribute ``key`` as int32; refused (``ValueError``) by ``span_checks.token_ids_problem``."""
    items = _checked(v, key, span_checks.token_ids_problem)
    if items is None or items.__class__ is PackedArray:
        return items
    return np.asarray(items, np.int32)


def logprobs(v: Any, key: str) -> np.ndarray | PackedArray | None:
    """Logprobs of attribute ``key`` as float32; refused (``ValueError``) by ``span_checks.logprobs_problem``."""
    items = _checked(v, key, span_checks.logprobs_problem)
    if items is None or items.__class__ is PackedArray:
        return items
    return np.asarray(items, np.float64).astype(np.float32)


def first_token_ids(keys: tuple[str, ...], attrs: dict[str, Any]) -> np.ndarray | PackedArray | None:
    """``token_ids`` of the first of ``keys`` with a value (``span_checks.first_present``'s pick)."""
    for k in keys:
        v = attrs[k]
        if v is not None and (v.__class__ is not str or v):
            return token_ids(v, k)
    return None


def token_column(name: str, n: int, rows: list[int], items: Sequence[Any], bad: dict[int, str]) -> pa.Array:
    """One list column of ``n`` rows from the arrays ``items`` at ``rows`` (every other row null).

    All packed arrays are decoded in one pass when they are all clean (the common case), else one
    by one; a record whose array fails validation is put in ``bad`` with the error, as if it had
    failed while decoding (its rows are dropped before the table is written).
    """
    typ = SPANS.field(name).type
    is_int = name != "completion_logprobs"
    fast = None
    if items and all(x.__class__ is PackedArray for x in items):
        fast = packed.decode_arrays([x.data for x in items], is_int)
    if fast is not None:
        values, counts = fast
    else:
        arrays: list[np.ndarray] = []
        for x in items:
            if x.__class__ is PackedArray:
                one = packed.decode_arrays([x.data], is_int)
                try:
                    x = one[0] if one is not None else (token_ids if is_int else logprobs)(x.items(), x.key)
                except Exception as exc:  # noqa: BLE001 - the record is quarantined, as any decode error
                    bad.setdefault(x.record, f"{type(exc).__name__}: {exc}")
                    x = np.zeros(0)
            arrays.append(x)
        counts = np.fromiter(map(len, arrays), np.int64, len(arrays))
        value_type = typ.value_type.to_pandas_dtype()
        values = np.concatenate(arrays).astype(value_type) if arrays else np.zeros(0, value_type)
    lengths = np.zeros(n, np.int64)
    lengths[rows] = counts
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    null = np.ones(n, bool)
    null[rows] = False
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, typ.value_type), mask=pa.array(null))
