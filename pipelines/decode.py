"""Kafka records to rows: OTLP span requests to `spans` rows, reward JSON to `rewards` rows.

Decoding is the hot path of ingestion. Each record is parsed once by upb, through the lite view of
`otlp_lite` that leaves token ids and logprobs as the bytes they arrived in; a span becomes one row
tuple (no per-span dict of columns), resource attributes are resolved and JSON-encoded once per
resource, and the batch decodes all token arrays in one numpy pass. The batch is turned into Arrow
once, column by column. Nothing here talks to Kafka or Delta: a record is its bytes plus where it
came from, so the same code serves ingestion, replay and tests.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

from pipelines.otlp_lite import ExportTraceServiceRequestLite
from schemas import attributes as A
from schemas import span_checks, topics
from schemas.errors import RecordValidationError
from schemas.tables import QUARANTINE, REWARDS, SPANS
from schemas.validation import validate_reward_event

_US_PER_DAY = 86_400_000_000
_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}

# Attribute keys that become typed columns, so they are not repeated in the JSON column.
_TYPED_KEYS = frozenset(
    {
        *A.ROLLOUT_ID_KEYS,
        *A.ATTEMPT_ID_KEYS,
        A.TASK_ID,
        *A.AGENT_NAME_KEYS,
        A.ROLLOUT_STATUS,
        *A.RESPONSE_ID_KEYS,
        *A.MODEL_KEYS,
        A.LLM_POLICY_VERSION,
        *A.PROMPT_TOKEN_IDS_KEYS,
        *A.COMPLETION_TOKEN_IDS_KEYS,
        A.LLM_COMPLETION_LOGPROBS,
        A.GEN_AI_INPUT_MESSAGES,
        A.GEN_AI_OUTPUT_MESSAGES,
        A.REWARD_VALUE,
        A.REWARD_NAME,
    }
)


class KafkaRecord(NamedTuple):
    """One Kafka record as ingestion sees it; decoupled from any client library.

    A named tuple: batches of records are pickled to decoder processes, and tuples pickle cheaply.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    timestamp_ms: int | None = None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v.decode("utf-8", "replace") if v is not None else None
        return None


def _any_value(v: Any) -> Any:
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
        values = v.array_value.values
        if not values:
            return []
        first = values[0].WhichOneof("value")
        # Token ids and logprobs are long homogeneous arrays: read them without per-item dispatch.
        if first == "int_value":
            return [x.int_value for x in values]
        if first == "double_value":
            fast = _double_array(v.array_value)
            return fast if fast is not None else [x.double_value for x in values]
        if first == "string_value":
            return [x.string_value for x in values]
        return [_any_value(x) for x in values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return None


def _lite_value(v: Any) -> Any:
    """An ``AnyValue`` of the lite view as ``_any_value`` reads it (nested values parsed from their bytes)."""
    kind = v.WhichOneof("value")
    if kind == "array_value" or kind == "kvlist_value":
        v = AnyValue.FromString(v.SerializeToString())
    return _any_value(v)


class _Packed:
    """A token-id or logprob array kept in wire form; the batch decodes all of them in one numpy pass.

    Reading 100 token ids item by item costs more than the rest of the span, so arrays under the
    token/logprob keys keep the ``ArrayValue`` bytes the lite parse left them in, and are decoded
    batch-wide in ``SpanBatch.to_table``.
    """

    __slots__ = ("data", "record", "key")

    def __init__(self, data: bytes, record: int, key: str) -> None:
        self.data = data
        self.record = record
        self.key = key  # the attribute it came from, named in a quarantine reason

    def value(self) -> Any:
        """The array as ``_any_value`` reads it: the slow path, for anything the fast pass refused."""
        return _any_value(AnyValue(array_value=ArrayValue.FromString(self.data)))


def _varint_items(b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``ArrayValue`` bytes of int items (``0x0a L 0x18 <varint>`` each) to int64 values and each item's offset.

    Every item has exactly four bytes below 0x80 (tag, length, tag, last varint byte), so their
    positions give every item's bounds at once, and checking them checks the whole layout. None if
    the bytes are anything else; varints longer than 5 bytes (negative or huge ids) are refused
    too, and left to the slow path, which raises the usual error.
    """
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends.size % 4:
        return None
    g = ends.reshape(-1, 4)
    tag, length, tag2, last = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
    k = last - tag2  # varint bytes per item
    if (
        tag[0] != 0
        or last[-1] != b.size - 1
        or not (tag[1:] == last[:-1] + 1).all()
        or not (length == tag + 1).all()
        or not (tag2 == length + 1).all()
        or not (b[tag] == 0x0A).all()
        or not (b[tag2] == 0x18).all()
        or not (b[length] == k + 1).all()
        or int(k.max()) > 5
    ):
        return None
    start = tag2 + 1
    out = (b[start] & 0x7F).astype(np.int64)
    for j in range(1, int(k.max())):
        m = k > j
        out[m] |= (b[start[m] + j] & 0x7F).astype(np.int64) << (7 * j)
    return out, tag


def _varints(data: bytes) -> np.ndarray | None:
    """One ``ArrayValue`` of int items to int64, or None if it is not exactly that."""
    got = _varint_items(np.frombuffer(data, np.uint8))
    return None if got is None else got[0]


def _doubles(b: np.ndarray) -> np.ndarray | None:
    """Doubles are fixed width on the wire (``0x0a 0x09 0x21`` + 8 bytes), so one reshape decodes them."""
    if b.size == 0 or b.size % 11:
        return None
    rows = b.reshape(-1, 11)
    if not ((rows[:, 0] == 0x0A).all() and (rows[:, 1] == 0x09).all() and (rows[:, 2] == 0x21).all()):
        return None
    return np.ascontiguousarray(rows[:, 3:]).view("<f8").ravel()


def _double_array(arr: Any) -> np.ndarray | None:
    return _doubles(np.frombuffer(arr.SerializeToString(), np.uint8))


def _decode_pieces(pieces: Sequence[bytes], is_int: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Many ``ArrayValue`` byte strings decoded in one pass: their values, concatenated, and each one's length.

    Ints come back as int32 (ids at or above 2**31 refuse the fast pass), doubles as float32. None
    when any piece is not cleanly one kind; the caller then reads them one by one.
    """
    sizes = np.fromiter(map(len, pieces), np.int64, len(pieces))
    b = np.frombuffer(b"".join(pieces), np.uint8)
    if not is_int:
        if (sizes % 11).any():
            return None
        values = _doubles(b) if b.size else np.zeros(0)
        # NaN is refused by span_checks.logprobs_problem: such a batch takes the slow path, which says so
        if values is None or np.isnan(values).any():
            return None
        return values.astype(np.float32), sizes // 11
    if not b.size:
        return np.zeros(0, np.int32), sizes
    got = _varint_items(b)
    if got is None:
        return None
    values, tags = got
    starts = np.cumsum(sizes) - sizes
    first = np.searchsorted(tags, starts)  # the first item at or after each piece's start
    nonempty = sizes > 0
    f = first[nonempty]
    # every piece starts on an item: a piece that is not one whole array never passes as one
    if (f >= tags.size).any() or (tags[f] != starts[nonempty]).any() or int(values.max()) >= 2**31:
        return None
    return values.astype(np.int32), np.diff(np.append(first, tags.size))


_INT_PACKED = frozenset({*A.PROMPT_TOKEN_IDS_KEYS, *A.COMPLETION_TOKEN_IDS_KEYS})
_PACKED_KEYS = frozenset({*_INT_PACKED, A.LLM_COMPLETION_LOGPROBS})


def _json_default(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


# json.dumps(..., default=...) builds an encoder per call; the C encoder, made once, writes the same text.
_JSON = json.JSONEncoder(default=_json_default)
_C_ENCODER = (
    c_make_encoder(None, _json_default, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    if c_make_encoder is not None
    else None
)


def _dumps(obj: Any) -> str:
    """``json.dumps(obj, default=_json_default)``, without its per-call setup."""
    if _C_ENCODER is None:
        return _JSON.encode(obj)
    return "".join(_C_ENCODER(obj, 0))


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _lite_value(kv.value) for kv in kvs}


def _first1(keys: Sequence[str], m: Mapping[str, Any]) -> Any:
    for k in keys:
        v = m.get(k)
        if v is not None and (v.__class__ is not str or v):
            return v
    return None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _checked(v: Any) -> Any:
    """``v`` as ``schemas.span_checks`` reads it: a JSON string parsed when it parses, arrays as lists."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except (ValueError, RecursionError):
            return v  # the check names it: not a JSON list
    return v.tolist() if isinstance(v, np.ndarray) else v


def _int_list(v: Any, key: str) -> np.ndarray | _Packed | None:
    """Token ids of attribute ``key`` as int32; refused (``ValueError``) by ``span_checks.token_ids_problem``."""
    if v is None or v.__class__ is _Packed:
        return v
    items = _checked(v)
    if (why := span_checks.token_ids_problem(items)) is not None:
        raise ValueError(f"attributes[{key}]: {why}")
    return np.asarray(items, np.int32)


def _float_list(v: Any, key: str) -> np.ndarray | _Packed | None:
    """Logprobs of attribute ``key`` as float32; refused (``ValueError``) by ``span_checks.logprobs_problem``."""
    if v is None or v.__class__ is _Packed:
        return v
    items = _checked(v)
    if (why := span_checks.logprobs_problem(items)) is not None:
        raise ValueError(f"attributes[{key}]: {why}")
    return np.asarray(items, np.float64).astype(np.float32)


def _token_column(name: str, n: int, rows: list[int], items: list[Any], bad: dict[int, str]) -> pa.Array:
    """One list column of ``n`` rows from the arrays ``items`` at ``rows`` (every other row null).

    All packed arrays are decoded in one pass when they are all clean (the common case), else one
    by one; a record whose array fails validation is put in ``bad`` with the error, as if it had
    failed while decoding (its rows are dropped before the table is written).
    """
    typ = SPANS.field(name).type
    is_int = name != "completion_logprobs"
    fast = None
    if items and all(x.__class__ is _Packed for x in items):
        fast = _decode_pieces([x.data for x in items], is_int)
    if fast is not None:
        values, counts = fast
    else:
        arrays: list[np.ndarray] = []
        for x in items:
            if x.__class__ is _Packed:
                one = _decode_pieces([x.data], is_int)
                try:
                    x = one[0] if one is not None else (_int_list if is_int else _float_list)(x.value(), x.key)
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


def _oi_response_id(attrs: Mapping[str, Any]) -> str | None:
    """The ``id`` of the raw OpenAI response an OpenInference LLM span keeps in ``output.value``.

    It is what joins the client's record of a call to the gateway's (exact tokens) when the client
    forwards no trace context.
    """
    if attrs[A.OI_SPAN_KIND] != A.OI_SPAN_KIND_LLM:
        return None
    raw = attrs[A.OI_OUTPUT_VALUE]
    if not isinstance(raw, str) or not raw.startswith("{") or '"id"' not in raw:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes: no id
        return None
    rid = value.get("id") if isinstance(value, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _messages_json(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else _dumps(v)


def _indexed_messages(attrs: Mapping[str, Any], prefix: str, role: str, content: str) -> str | None:
    """Flattened `prefix{i}.{role|content}` attributes (old GenAI, OpenInference) to a JSON list."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        idx, _, field = key[len(prefix) :].partition(".")
        if not idx.isdigit():
            continue
        if field == role:
            found.setdefault(int(idx), {})["role"] = value
        elif field == content:
            found.setdefault(int(idx), {})["content"] = value
    if not found:
        return None
    return json.dumps([found[i] for i in sorted(found)])


def _flat_messages(attrs: Mapping[str, Any], openinference_prefix: str, old_genai_prefix: str) -> str | None:
    """Messages flattened the OpenInference way, else the old GenAI way, as a JSON list."""
    return _indexed_messages(
        attrs, openinference_prefix, A.OI_MESSAGE_ROLE_SUFFIX, A.OI_MESSAGE_CONTENT_SUFFIX
    ) or _indexed_messages(attrs, old_genai_prefix, "role", "content")


def _reward_value(value: Any, key: str) -> float:
    """A reward as float; refused (``ValueError``) by ``span_checks.reward_value_problem``, as the collector does."""
    if (why := span_checks.reward_value_problem(value)) is not None:
        raise ValueError(f"attributes[{key}]: {why}")
    return float(value)


def _reward(name: str, attrs: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The reward a span carries, our convention or Agent Lightning's; unnamed rewards are primary."""
    if name == A.REWARD_SPAN_NAME and attrs.get(A.REWARD_VALUE) is not None:
        value = _reward_value(attrs[A.REWARD_VALUE], A.REWARD_VALUE)
        return value, _str(attrs.get(A.REWARD_NAME)) or A.PRIMARY_REWARD_NAME
    if name == A.AGL_REWARD_SPAN_NAME:
        key = f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_VALUE_SUFFIX}"
        if attrs.get(key) is None:
            key = A.AGL_LEGACY_REWARD
        if attrs.get(key) is not None:
            rname = attrs.get(f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_NAME_SUFFIX}")
            return _reward_value(attrs[key], key), _str(rname) or A.PRIMARY_REWARD_NAME
    return None, None


_SPAN_COLUMNS = tuple(f.name for f in SPANS)
# Columns every span of one resource in one record shares: kept once per such group, not per span.
_GROUP_COLUMNS = (
    "tenant",
    "service_name",
    "resource_attributes",
    "received_at",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
)
_LISTS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")
# What a row tuple holds, in order: the span's own scalar columns (start and end in nanoseconds,
# end 0 when the span has not ended), then the index of its group. Token arrays are kept apart,
# for the few spans that have them, so that pyarrow converts the row tuples in one call.
# `redacted` is left null here (not redacted): ingestion's redaction step fills it (pipelines.redact).
_ROW_COLUMNS = (*(c for c in _SPAN_COLUMNS if c not in {*_GROUP_COLUMNS, *_LISTS, "day", "redacted"}), "group")
_ROW_TYPE = pa.struct(
    [
        pa.field(c, pa.uint64() if c in ("start_time", "end_time") else pa.int64())
        if c in ("start_time", "end_time", "group")
        else SPANS.field(c)
        for c in _ROW_COLUMNS
    ]
)


class SpanBatch:
    """`spans` rows (tuples, one per span) plus `quarantine` rows, filled record by record.

    A row holds the span's start and end in nanoseconds (end 0: not ended) and packed token arrays;
    ``to_table`` turns the batch into Arrow column by column, so no per-span work is left there.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.groups: list[tuple[Any, ...]] = []  # _GROUP_COLUMNS of each (record, resource)
        self.tokens: list[tuple[int, Any, Any, Any]] = []  # (row, prompt ids, completion ids, logprobs)
        self.records = 0
        self._quarantine: list[tuple[int, dict[str, Any]]] = []
        self._recs: list[KafkaRecord] = []
        self._ranges: list[tuple[int, int]] = []  # rows of each record, for dropping a late-failing one
        self._built: tuple[pa.Table, list[dict[str, Any]]] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rec: KafkaRecord) -> int:
        """Decode one record; on any error quarantine the whole record and return 0."""
        idx = self.records
        self.records += 1
        self._built = None
        self._recs.append(rec)
        try:
            rows, tokens = _decode_request(rec, idx, self.groups)
        except Exception as exc:  # noqa: BLE001 - any bad record is quarantined, never fatal
            self._quarantine.append((idx, quarantine_row(rec, f"{type(exc).__name__}: {exc}")))
            self._ranges.append((len(self.rows), len(self.rows)))
            return 0
        n = len(self.rows)
        self.rows.extend(rows)
        self.tokens.extend((n + i, p, c, lp) for i, p, c, lp in tokens)
        self._ranges.append((n, len(self.rows)))
        return len(rows)

    @property
    def quarantine(self) -> list[dict[str, Any]]:
        """Quarantine rows in record order, including records whose token arrays failed at build."""
        return self._build()[1]

    def to_table(self) -> pa.Table:
        return self._build()[0]

    def quarantine_table(self) -> pa.Table:
        return pa.Table.from_pylist(self.quarantine, schema=QUARANTINE)

    def _build(self) -> tuple[pa.Table, list[dict[str, Any]]]:
        if self._built is not None:
            return self._built
        n = len(self.rows)
        rows = pa.array(self.rows, _ROW_TYPE)  # tuples to a struct: one C++ pass, no Python transpose
        cols: dict[str, Any] = dict(zip(_ROW_COLUMNS, rows.flatten(), strict=True))
        group = cols.pop("group")
        groups = zip(*self.groups, strict=True) if self.groups else ((),) * len(_GROUP_COLUMNS)
        for name, values in zip(_GROUP_COLUMNS, groups, strict=True):
            typ = SPANS.field(name).type
            arr = pa.array(values, pa.int64()).cast(typ) if name == "received_at" else pa.array(values, typ)
            cols[name] = arr.take(group)
        bad: dict[int, str] = {}
        for column, name in enumerate(_LISTS, start=1):
            present = [t for t in self.tokens if t[column] is not None]
            cols[name] = _token_column(name, n, [t[0] for t in present], [t[column] for t in present], bad)
        start_ns = cols["start_time"].to_numpy(zero_copy_only=False)
        end_ns = cols["end_time"].to_numpy(zero_copy_only=False)
        start_us = (start_ns // 1000).astype(np.int64)
        cols["start_time"] = pa.array(start_us).cast(SPANS.field("start_time").type)
        cols["end_time"] = pa.array((end_ns // 1000).astype(np.int64), mask=end_ns == 0).cast(
            SPANS.field("end_time").type
        )
        cols["day"] = pa.array((start_us // _US_PER_DAY).astype(np.int32)).cast(pa.date32())
        cols["redacted"] = pa.nulls(n, SPANS.field("redacted").type)
        table = pa.Table.from_pydict(cols, schema=SPANS)
        quarantine = list(self._quarantine)
        if bad:
            keep = np.ones(n, bool)
            for idx, err in bad.items():
                lo, hi = self._ranges[idx]
                keep[lo:hi] = False
                quarantine.append((idx, quarantine_row(self._recs[idx], err)))
            table = table.filter(pa.array(keep))
        quarantine.sort(key=lambda q: q[0])
        self._built = (table, [q for _, q in quarantine])
        return self._built


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic collector off for a while, as it was before afterwards.

    Decoding a batch allocates millions of short-lived tuples and strings and no reference cycles;
    the collector, triggered by allocation counts, would walk them over and over (measured: 15% of
    decoding time).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def decode_spans(records: Iterable[KafkaRecord]) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Span records to a `spans` table and the `quarantine` rows of those that could not be decoded."""
    with _gc_paused():
        batch = SpanBatch()
        for rec in records:
            batch.add(rec)
        return batch.to_table(), batch.quarantine


_FLAT_MESSAGE_PREFIXES = (
    A.OI_LLM_INPUT_MESSAGES_PREFIX,
    A.OI_LLM_OUTPUT_MESSAGES_PREFIX,
    A.GEN_AI_PROMPT_PREFIX_OLD,
    A.GEN_AI_COMPLETION_PREFIX_OLD,
)


class _Resource:
    """What every span of one resource shares, worked out once: its attributes as dict and JSON."""

    __slots__ = ("attrs", "json", "rollout", "attempt", "task", "agent", "service")

    def __init__(self, kvs: Any) -> None:
        res = _attrs(kvs)
        self.attrs = res
        self.json = _dumps(res) if res else None
        self.rollout = _first1(A.ROLLOUT_ID_KEYS, res)
        self.attempt = _first1(A.ATTEMPT_ID_KEYS, res)
        self.task = _first1((A.TASK_ID,), res)
        self.agent = _first1(A.AGENT_NAME_KEYS, res)
        self.service = _str(res.get(A.SERVICE_NAME))


class _Shape:
    """What a span's attribute keys alone decide, worked out once per distinct tuple of keys.

    Spans of one agent carry the same keys over and over, so which keys feed which typed column,
    which go to the JSON column and whether flattened messages may be present is looked up, not
    recomputed for every span. Values still go through the same checks (empty strings skipped).
    """

    __slots__ = (
        "rollout",
        "attempt",
        "task",
        "agent",
        "status",
        "response",
        "oi_output",
        "model",
        "policy",
        "prompt",
        "completion",
        "logprobs",
        "msg_in",
        "msg_out",
        "flat",
        "rest",
        "all_rest",
    )

    def __init__(self, keys: tuple[str, ...]) -> None:
        def present(candidates: Sequence[str]) -> tuple[str, ...]:
            return tuple(k for k in candidates if k in keys)

        self.rollout = present(A.ROLLOUT_ID_KEYS)
        self.attempt = present(A.ATTEMPT_ID_KEYS)
        self.task = present((A.TASK_ID,))
        self.agent = present(A.AGENT_NAME_KEYS)
        self.status = present((A.ROLLOUT_STATUS,))
        self.response = present(A.RESPONSE_ID_KEYS)
        # OpenInference's OpenAI instrumentation records no response id, only the raw response
        self.oi_output = not self.response and A.OI_OUTPUT_VALUE in keys and A.OI_SPAN_KIND in keys
        self.model = present(A.MODEL_KEYS)
        self.policy = present((A.LLM_POLICY_VERSION,))
        self.prompt = present(A.PROMPT_TOKEN_IDS_KEYS)
        self.completion = present(A.COMPLETION_TOKEN_IDS_KEYS)
        self.logprobs = present((A.LLM_COMPLETION_LOGPROBS,))
        self.msg_in = A.GEN_AI_INPUT_MESSAGES in keys
        self.msg_out = A.GEN_AI_OUTPUT_MESSAGES in keys
        self.flat = any(k.startswith(_FLAT_MESSAGE_PREFIXES) for k in keys)
        self.rest = tuple(k for k in keys if k not in _TYPED_KEYS)
        self.all_rest = len(self.rest) == len(keys)


_SHAPES: dict[tuple[str, ...], _Shape] = {}


def _shape(keys: tuple[str, ...]) -> _Shape:
    if len(_SHAPES) > 4096:  # many distinct key sets (free-form attribute names): stay bounded
        _SHAPES.clear()
    shape = _SHAPES[keys] = _Shape(keys)
    return shape


def _pick(keys: tuple[str, ...], attrs: Mapping[str, Any]) -> Any:
    """The first of ``keys`` with a value that is neither None nor an empty string."""
    for k in keys:
        v = attrs[k]
        if v is not None and (v.__class__ is not str or v):
            return v
    return None


def _pick_list(keys: tuple[str, ...], attrs: Mapping[str, Any], read: Any) -> Any:
    """``read(value, key)`` of the key ``_pick`` picks (``span_checks.first_present``'s), or None."""
    for k in keys:
        v = attrs[k]
        if v is not None and (v.__class__ is not str or v):
            return read(v, k)
    return None


_REWARD_SPAN_NAMES = frozenset({A.REWARD_SPAN_NAME, A.AGL_REWARD_SPAN_NAME})
_ROLLOUT_COLUMN = _ROW_COLUMNS.index("rollout_id")


def _decode_request(
    rec: KafkaRecord, record: int, groups: list[tuple[Any, ...]]
) -> tuple[list[tuple[Any, ...]], list[tuple[int, Any, Any, Any]]]:
    """The record's spans as row tuples (``_ROW_COLUMNS``) and their token arrays by row index.

    Appends the groups the rows point to (a failed record leaves unused groups: harmless).
    """
    if not rec.value:
        raise ValueError("empty record value")
    req = ExportTraceServiceRequestLite.FromString(rec.value)
    tenant = rec.header(topics.HEADER_TENANT) or topics.DEFAULT_TENANT
    received = rec.header(topics.HEADER_RECEIVED_AT)
    if received is not None:
        received_us: int | None = int(received) // 1000
    elif rec.timestamp_ms is not None:
        received_us = rec.timestamp_ms * 1000
    else:
        received_us = None
    key = rec.key.decode("utf-8", "replace") if rec.key else None
    topic, partition, offset = rec.topic, rec.partition, rec.offset
    packed_keys = _PACKED_KEYS
    shapes = _SHAPES
    kinds = _KINDS
    statuses = _STATUS

    rows: list[tuple[Any, ...]] = []
    tokens: list[tuple[int, Any, Any, Any]] = []
    # The rollout id may sit on one span of the trace only (the root); spread it over the record.
    trace_rollout: dict[bytes, str] = {}
    unresolved: list[tuple[int, bytes]] = []  # rows whose rollout comes from another span or the key
    for rs in req.resource_spans:
        res = _Resource(rs.resource.attributes)
        group = len(groups)
        groups.append((tenant, res.service, res.json, received_us, topic, partition, offset))
        for ss in rs.scope_spans:
            for span in ss.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    raise ValueError(
                        f"span {span.name!r} has a trace id of {len(trace_id)} bytes and a span id of "
                        f"{len(span_id)} bytes; OTLP needs 16 and 8"
                    )
                attrs: dict[str, Any] = {}
                for kv in span.attributes:
                    v = kv.value
                    sv = v.string_value
                    if sv:
                        attrs[kv.key] = sv
                    else:
                        k = kv.key
                        if k in packed_keys and v.HasField("array_value"):
                            # Left in wire form: the batch decodes all token arrays in one numpy pass.
                            attrs[k] = _Packed(v.array_value, record, k)
                        else:
                            attrs[k] = _lite_value(v)
                name = span.name
                if attrs:
                    keys = tuple(attrs)
                    shape = shapes.get(keys) or _shape(keys)
                    rid = _pick(shape.rollout, attrs) if shape.rollout else None
                    if rid is None:
                        rid = res.rollout
                    if name in _REWARD_SPAN_NAMES:
                        reward_value, reward_name = _reward(name, attrs)
                    else:
                        reward_value = reward_name = None
                    input_messages = _messages_json(attrs[A.GEN_AI_INPUT_MESSAGES]) if shape.msg_in else None
                    output_messages = _messages_json(attrs[A.GEN_AI_OUTPUT_MESSAGES]) if shape.msg_out else None
                    if shape.flat:
                        if input_messages is None:
                            input_messages = _flat_messages(
                                attrs, A.OI_LLM_INPUT_MESSAGES_PREFIX, A.GEN_AI_PROMPT_PREFIX_OLD
                            )
                        if output_messages is None:
                            output_messages = _flat_messages(
                                attrs, A.OI_LLM_OUTPUT_MESSAGES_PREFIX, A.GEN_AI_COMPLETION_PREFIX_OLD
                            )
                    if shape.all_rest:
                        rest_json: str | None = _dumps(attrs)
                    elif shape.rest:
                        rest_json = _dumps({k: attrs[k] for k in shape.rest})
                    else:
                        rest_json = None
                    if shape.prompt or shape.completion or shape.logprobs:
                        tokens.append(
                            (
                                len(rows),
                                _pick_list(shape.prompt, attrs, _int_list) if shape.prompt else None,
                                _pick_list(shape.completion, attrs, _int_list) if shape.completion else None,
                                _float_list(attrs[shape.logprobs[0]], shape.logprobs[0]) if shape.logprobs else None,
                            )
                        )
                    attempt = _pick(shape.attempt, attrs) if shape.attempt else None
                    task = _pick(shape.task, attrs) if shape.task else None
                    agent = _pick(shape.agent, attrs) if shape.agent else None
                    tail: tuple[Any, ...] = (
                        _str(attempt if attempt is not None else res.attempt),
                        _str(task if task is not None else res.task),
                        _str(agent if agent is not None else res.agent),
                        _str(attrs[shape.status[0]]) if shape.status else None,
                        _str(_pick(shape.response, attrs))
                        if shape.response
                        else (_oi_response_id(attrs) if shape.oi_output else None),
                        _str(_pick(shape.model, attrs)) if shape.model else None,
                        _str(attrs[shape.policy[0]]) if shape.policy else None,
                        input_messages,
                        output_messages,
                        reward_value,
                        reward_name,
                        rest_json,
                    )
                else:
                    rid = res.rollout
                    tail = (_str(res.attempt), _str(res.task), _str(res.agent), *_NO_ATTRS)
                if rid is not None:
                    trace_rollout.setdefault(trace_id, str(rid))
                if not rid:  # an empty or missing id takes the trace's, known once all spans are read
                    unresolved.append((len(rows), trace_id))
                parent = span.parent_span_id
                status = span.status
                rows.append(
                    (
                        trace_id.hex(),
                        span_id.hex(),
                        parent.hex() if parent else None,
                        name,
                        kinds.get(span.kind, "UNSPECIFIED"),
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        statuses.get(status.code, "UNSET"),
                        status.message or None,
                        None if rid is None else str(rid),
                        *tail,
                        group,
                    )
                )
    if not rows:
        raise ValueError("the request holds no spans")
    for i, trace_id in unresolved:
        row = rows[i]
        rollout = trace_rollout.get(trace_id)
        if rollout is None:
            # The collector keys a record by rollout id when it knows one, else by the trace id.
            trace_hex = row[0]
            rollout = key if key and key != trace_hex else trace_hex
        rows[i] = (*row[:_ROLLOUT_COLUMN], rollout, *row[_ROLLOUT_COLUMN + 1 :])
    return rows, tokens


_NO_ATTRS = (None,) * 9


def quarantine_row(rec: KafkaRecord, error: str) -> dict[str, Any]:
    """A `quarantine` row: the raw record, where it came from and why it was refused."""
    headers = {k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in rec.headers}
    return {
        "kafka_topic": rec.topic,
        "kafka_partition": rec.partition,
        "kafka_offset": rec.offset,
        "key": rec.key,
        "value": rec.value,
        "headers": json.dumps(headers),
        "error": error[:2000],
        "quarantined_at": dt.datetime.now(dt.UTC),
    }


def decode_reward_event(rec: KafkaRecord) -> dict[str, Any]:
    """One reward event record to a `rewards` row; raises ``RecordValidationError`` on bad input."""
    if not rec.value:
        raise RecordValidationError("<record>", "empty record value")
    try:
        raw = json.loads(rec.value)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordValidationError("<record>", f"not a JSON object: {exc}") from exc
    ev = validate_reward_event(raw)
    when = ev.get("timestamp")
    if when is None:
        received = rec.header(topics.HEADER_RECEIVED_AT)
        if received is not None:
            when = dt.datetime.fromtimestamp(int(received) / 1e9, dt.UTC)
        elif rec.timestamp_ms is not None:
            when = dt.datetime.fromtimestamp(rec.timestamp_ms / 1e3, dt.UTC)
        else:
            when = dt.datetime.now(dt.UTC)
    # The collector's stamp (from the bearer token) decides; a body's own `tenant` only where no
    # collector stamped the record. The tenant keys every match of the event (pipelines/keys.py).
    tenant = rec.header(topics.HEADER_TENANT) or ev.get("tenant") or topics.DEFAULT_TENANT
    return {
        "reward_id": ev.get("event_id") or f"{rec.topic}:{rec.partition}:{rec.offset}",
        "source": "event",
        "tenant": tenant,
        "rollout_id": ev.get("rollout_id"),
        "attempt_id": ev.get("attempt_id"),
        "trace_id": ev.get("trace_id"),
        "llm_response_id": ev.get("response_id"),
        "span_id": None,
        "name": ev["name"],
        "value": ev["value"],
        "event_time": when,
        "kafka_topic": rec.topic,
        "kafka_partition": rec.partition,
        "kafka_offset": rec.offset,
        "day": when.date(),
    }


def reward_rows_from_spans(spans: pa.Table) -> pa.Table:
    """Reward spans (already decoded into `spans` rows) as `rewards` rows."""
    import polars as pl

    df = pl.from_arrow(spans).filter(pl.col("reward_value").is_not_null())
    assert isinstance(df, pl.DataFrame)
    out = df.select(
        pl.col("span_id").alias("reward_id"),
        pl.lit("span").alias("source"),
        "tenant",
        "rollout_id",
        "attempt_id",
        "trace_id",
        "llm_response_id",
        "span_id",
        pl.col("reward_name").fill_null(A.PRIMARY_REWARD_NAME).alias("name"),
        pl.col("reward_value").alias("value"),
        pl.col("start_time").alias("event_time"),  # when the reward was given: matched against call ends
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        "day",
    )
    return out.to_arrow().cast(REWARDS)


def rewards_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=REWARDS)


def microseconds(ts: dt.datetime) -> int:
    """Aware datetime to integer microseconds since the epoch (Delta transaction versions)."""
    return int(ts.timestamp() * 1_000_000)
