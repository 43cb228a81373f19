"""Check records against our Arrow schemas, naming the field that is wrong.

Records arrive as decoded JSON (reward events, release events) or as Python dicts built by
our own code before a Delta write. ``validate_record`` normalizes values to what Arrow expects
(timestamps to aware datetimes, ints to int, ...) and raises ``RecordValidationError`` naming
the first bad field, so an HTTP handler can answer 400 with that message.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from schemas.errors import RecordValidationError
from schemas.span_checks import MAX_TIME_NS, MIN_TIME_NS
from schemas.tables import REWARD_EVENT

_INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _digits(value: int | float) -> str:
    """A huge integer, named without printing all of it."""
    return f"an integer of {len(str(abs(value)))} digits" if abs(value) >= 10**30 else str(value)


def _is_unicode(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (JSON lets a lone surrogate in as an escape; nothing downstream takes it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_value(path: str, value: Any, typ: pa.DataType) -> Any:
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        if not isinstance(value, str):
            raise RecordValidationError(path, f"expected a string, got {_type_name(value)}")
        if not value.isascii() and not _is_unicode(value):
            raise RecordValidationError(path, "holds a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode")
        return value
    if pa.types.is_boolean(typ):
        if not isinstance(value, bool):
            raise RecordValidationError(path, f"expected true or false, got {_type_name(value)}")
        return value
    if pa.types.is_integer(typ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordValidationError(path, f"expected an integer, got {_type_name(value)}")
        lo, hi = _INT_RANGES.get(typ, (-(2**63), 2**64 - 1))
        if not lo <= value <= hi:
            raise RecordValidationError(path, f"{value} is outside the range of {typ}")
        return value
    if pa.types.is_floating(typ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordValidationError(path, f"expected a number, got {_type_name(value)}")
        try:
            number = float(value)
        except OverflowError as exc:  # an integer of hundreds of digits: no float holds it
            raise RecordValidationError(path, f"{_digits(value)} is too large for a 64-bit float") from exc
        if not math.isfinite(number):
            raise RecordValidationError(path, f"expected a finite number, got {value}")
        return number
    if pa.types.is_timestamp(typ):
        return _check_timestamp(path, value)
    if pa.types.is_date32(typ):
        if isinstance(value, dt.datetime) or not isinstance(value, dt.date | str):
            raise RecordValidationError(path, f"expected a date (YYYY-MM-DD), got {_type_name(value)}")
        if isinstance(value, str):
            try:
                return dt.date.fromisoformat(value)
            except ValueError as exc:
                raise RecordValidationError(path, f"expected a date (YYYY-MM-DD), got {value!r}") from exc
        return value
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        if not isinstance(value, bytes | bytearray):
            raise RecordValidationError(path, f"expected bytes, got {_type_name(value)}")
        return bytes(value)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        if not isinstance(value, list | tuple):
            raise RecordValidationError(path, f"expected a list, got {_type_name(value)}")
        item = typ.value_field
        out: list[Any] = []
        for i, v in enumerate(value):
            if v is None:
                if not item.nullable:
                    raise RecordValidationError(f"{path}[{i}]", "must not be null")
                out.append(None)
            else:
                out.append(_check_value(f"{path}[{i}]", v, item.type))
        return out
    if pa.types.is_struct(typ):
        if not isinstance(value, Mapping):
            raise RecordValidationError(path, f"expected an object, got {_type_name(value)}")
        return _check_fields(path + ".", value, typ)
    raise RecordValidationError(path, f"unsupported type {typ}")  # pragma: no cover - schema bug


def _to_utc(path: str, value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; a time whose offset takes it past year 1 or 9999 is refused, not an OverflowError."""
    try:
        return value.astimezone(dt.UTC)
    except OverflowError as exc:
        raise RecordValidationError(path, f"{value.isoformat()} is out of range in UTC") from exc


def _check_timestamp(path: str, value: Any) -> dt.datetime:
    """Accept aware datetimes, ISO 8601 strings with a zone, or integer nanoseconds since the epoch."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise RecordValidationError(path, "timestamp has no time zone; use UTC")
        return _to_utc(path, value)
    if isinstance(value, bool):
        raise RecordValidationError(path, "expected a timestamp, got bool")
    if isinstance(value, int):
        if not 0 <= value < 2**63:
            raise RecordValidationError(path, f"{value} is not a valid nanosecond timestamp")
        return dt.datetime.fromtimestamp(value / 1e9, dt.UTC)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise RecordValidationError(path, f"{value!r} is not an ISO 8601 timestamp") from exc
        if parsed.tzinfo is None:
            raise RecordValidationError(path, f"{value!r} has no time zone; add 'Z' or an offset")
        return _to_utc(path, parsed)
    raise RecordValidationError(path, f"expected an ISO 8601 string or integer nanoseconds, got {_type_name(value)}")


_Plan = tuple[frozenset[str], tuple[tuple[str, bool, pa.DataType], ...]]
_PLANS: dict[int, tuple[object, _Plan]] = {}


def _plan(fields: Iterable[pa.Field]) -> _Plan:
    """Field names and (name, nullable, type) of a schema or struct, worked out once per object.

    Reading them back from pyarrow for every record cost more than checking the values: a body of
    300,000 reward events spent most of its time here.
    """
    cached = _PLANS.get(id(fields))
    if cached is not None and cached[0] is fields:
        return cached[1]
    items = tuple((f.name, f.nullable, f.type) for f in fields)
    plan = (frozenset(name for name, _, _ in items), items)
    if len(_PLANS) < 256:  # our schemas are module constants; struct types built on the fly are not kept
        _PLANS[id(fields)] = (fields, plan)
    return plan


def _check_fields(prefix: str, record: Mapping[str, Any], fields: Iterable[pa.Field]) -> dict[str, Any]:
    known, items = _plan(fields)
    for key in record:
        if not isinstance(key, str) or key not in known:
            raise RecordValidationError(
                f"{prefix}{key}", f"unknown field; expected some of: {', '.join(sorted(known))}"
            )
    out: dict[str, Any] = {}
    for name, nullable, typ in items:
        value = record.get(name)
        if value is None:
            if not nullable:
                raise RecordValidationError(f"{prefix}{name}", "is required")
            out[name] = None
            continue
        out[name] = _check_value(f"{prefix}{name}", value, typ)
    return out


def validate_record(record: Any, schema: pa.Schema) -> dict[str, Any]:
    """Return ``record`` normalized to ``schema``; raise ``RecordValidationError`` naming the bad field."""
    if not isinstance(record, Mapping):
        raise RecordValidationError("<record>", f"expected a JSON object, got {_type_name(record)}")
    return _check_fields("", record, schema)


# A reward decided outside these years is a broken clock or a unit mistake: the same window as span times.
_EARLIEST = dt.datetime.fromtimestamp(MIN_TIME_NS // 10**9, dt.UTC)
_LATEST = dt.datetime.fromtimestamp(MAX_TIME_NS // 10**9, dt.UTC)


def validate_reward_event(record: Any) -> dict[str, Any]:
    """Validate a reward event: the schema, at least one id that names the rollout, a plausible time."""
    out = validate_record(record, REWARD_EVENT)
    if not any(out.get(k) for k in ("rollout_id", "trace_id", "response_id")):
        raise RecordValidationError(
            "rollout_id", "a reward must name its rollout: give rollout_id, trace_id or response_id"
        )
    if out.get("trace_id") is not None:
        tid = out["trace_id"].lower()
        if len(tid) != 32 or any(c not in "0123456789abcdef" for c in tid):
            raise RecordValidationError("trace_id", "expected 32 hexadecimal digits")
        out["trace_id"] = tid
    when = out.get("timestamp")
    if when is not None and not _EARLIEST <= when < _LATEST:
        raise RecordValidationError("timestamp", f"{when.isoformat()} is not between 2000-01-01 and 2100-01-01")
    if out.get("name") is None:
        out["name"] = "primary"
    return out


def to_table(records: Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Validate each record and build an Arrow table of ``schema``."""
    rows = [validate_record(r, schema) for r in records]
    return pa.Table.from_pylist(rows, schema=schema)
