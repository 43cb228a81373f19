"""Kafka records to rows: OTLP span requests to `spans` rows, reward JSON to `rewards` rows.

Decoding is the hot path of ingestion, so rows are built column by column (one Python list per
column) and turned into Arrow once per batch. Nothing here talks to Kafka or Delta: a record is
its bytes plus where it came from, so the same code serves ingestion, replay and tests.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from schemas import attributes as A
from schemas import topics
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


@dataclass(frozen=True)
class KafkaRecord:
    """One Kafka record as ingestion sees it; decoupled from any client library."""

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


def _double_array(arr: Any) -> np.ndarray | None:
    """Doubles are fixed width on the wire (``0x0a 0x09 0x21`` + 8 bytes), so one reshape decodes them."""
    b = np.frombuffer(arr.SerializeToString(), np.uint8)
    if b.size % 11:
        return None
    rows = b.reshape(-1, 11)
    if not ((rows[:, 0] == 0x0A).all() and (rows[:, 1] == 0x09).all() and (rows[:, 2] == 0x21).all()):
        return None
    return np.ascontiguousarray(rows[:, 3:]).view("<f8").ravel()


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


def _json_default(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _first(keys: Sequence[str], *maps: Mapping[str, Any]) -> Any:
    for m in maps:
        for k in keys:
            v = m.get(k)
            if v is not None and (v.__class__ is not str or v):
                return v
    return None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _int_list(v: Any) -> np.ndarray | None:
    if v is None:
        return None
    if isinstance(v, str):  # some SDKs can only write strings: accept a JSON list
        v = json.loads(v)
    arr = np.asarray(v) if isinstance(v, list) else v
    if not isinstance(arr, np.ndarray) or (arr.dtype.kind not in "iu" and arr.size):
        raise ValueError(f"token ids must be a list of integers, got {type(v).__name__}")
    if arr.size and (arr.min() < 0 or arr.max() >= 2**31):
        raise ValueError("token ids must be between 0 and 2**31-1")
    return arr.astype(np.int32)


def _float_list(v: Any) -> np.ndarray | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = json.loads(v)
    if isinstance(v, np.ndarray):
        return v.astype(np.float32)
    if not isinstance(v, list):
        raise ValueError(f"logprobs must be a list of numbers, got {type(v).__name__}")
    return np.asarray(v, np.float64).astype(np.float32)


def _list_array(items: list[np.ndarray | None], typ: pa.DataType) -> pa.Array:
    """A list column straight from numpy pieces: one concatenate instead of a Python loop."""
    lengths = np.fromiter((0 if x is None else len(x) for x in items), np.int64, len(items))
    offsets = np.zeros(len(items) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    value_type = typ.value_type.to_pandas_dtype()
    pieces = [x for x in items if x is not None]
    values = np.concatenate(pieces).astype(value_type) if pieces else np.zeros(0, value_type)
    mask = pa.array([x is None for x in items], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, typ.value_type), mask=mask)


def _messages_json(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v, default=_json_default)


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


def _reward(name: str, attrs: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The reward a span carries, our convention or Agent Lightning's; unnamed rewards are primary."""
    if name == A.REWARD_SPAN_NAME and attrs.get(A.REWARD_VALUE) is not None:
        return float(attrs[A.REWARD_VALUE]), _str(attrs.get(A.REWARD_NAME)) or A.PRIMARY_REWARD_NAME
    if name == A.AGL_REWARD_SPAN_NAME:
        value = attrs.get(f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_VALUE_SUFFIX}")
        if value is None:
            value = attrs.get(A.AGL_LEGACY_REWARD)
        if value is not None:
            rname = attrs.get(f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_NAME_SUFFIX}")
            return float(value), _str(rname) or A.PRIMARY_REWARD_NAME
    return None, None


class SpanBatch:
    """Column lists for `spans` rows plus `quarantine` rows, filled record by record."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in SPANS}
        self.quarantine: list[dict[str, Any]] = []
        self.records = 0

    def __len__(self) -> int:
        return len(self.cols["span_id"])

    def add(self, rec: KafkaRecord) -> int:
        """Decode one record; on any error quarantine the whole record and return 0."""
        self.records += 1
        n_before = len(self)
        try:
            rows = _decode_request(rec)
        except Exception as exc:  # noqa: BLE001 - any bad record is quarantined, never fatal
            self.quarantine.append(quarantine_row(rec, f"{type(exc).__name__}: {exc}"))
            return 0
        cols = self.cols
        for row in rows:
            for name, value in zip(_SPAN_COLUMNS, row, strict=True):
                cols[name].append(value)
        return len(self) - n_before

    def to_table(self) -> pa.Table:
        cols = dict(self.cols)
        for name in ("start_time", "end_time", "received_at"):
            cols[name] = pa.array(cols[name], pa.int64()).cast(SPANS.field(name).type)
        cols["day"] = pa.array(cols["day"], pa.int32()).cast(pa.date32())
        for name in ("prompt_token_ids", "completion_token_ids", "completion_logprobs"):
            cols[name] = _list_array(cols[name], SPANS.field(name).type)
        return pa.Table.from_pydict(cols, schema=SPANS)

    def quarantine_table(self) -> pa.Table:
        return pa.Table.from_pylist(self.quarantine, schema=QUARANTINE)


_SPAN_COLUMNS = tuple(f.name for f in SPANS)
_FLAT_MESSAGE_PREFIXES = (
    A.OI_LLM_INPUT_MESSAGES_PREFIX,
    A.OI_LLM_OUTPUT_MESSAGES_PREFIX,
    A.GEN_AI_PROMPT_PREFIX_OLD,
    A.GEN_AI_COMPLETION_PREFIX_OLD,
)


def _decode_request(rec: KafkaRecord) -> list[tuple[Any, ...]]:
    if not rec.value:
        raise ValueError("empty record value")
    req = ExportTraceServiceRequest.FromString(rec.value)
    tenant = rec.header(topics.HEADER_TENANT) or topics.DEFAULT_TENANT
    received = rec.header(topics.HEADER_RECEIVED_AT)
    if received is not None:
        received_us: int | None = int(received) // 1000
    elif rec.timestamp_ms is not None:
        received_us = rec.timestamp_ms * 1000
    else:
        received_us = None
    key = rec.key.decode("utf-8", "replace") if rec.key else None

    rows: list[tuple[Any, ...]] = []
    # The rollout id may sit on one span of the trace only (the root); spread it over the record.
    trace_rollout: dict[bytes, str] = {}
    decoded = []
    for rs in req.resource_spans:
        res = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    raise ValueError(
                        f"span {span.name!r} has a trace id of {len(span.trace_id)} bytes and a span id of "
                        f"{len(span.span_id)} bytes; OTLP needs 16 and 8"
                    )
                attrs = _attrs(span.attributes)
                rid = _first(A.ROLLOUT_ID_KEYS, attrs, res)
                if rid is not None:
                    trace_rollout.setdefault(span.trace_id, str(rid))
                decoded.append((res, span, attrs))
    if not decoded:
        raise ValueError("the request holds no spans")

    for res, span, attrs in decoded:
        trace_hex = span.trace_id.hex()
        rollout = _first(A.ROLLOUT_ID_KEYS, attrs, res) or trace_rollout.get(span.trace_id)
        if rollout is None:
            # The collector keys a record by rollout id when it knows one, else by the trace id.
            rollout = key if key and key != trace_hex else trace_hex
        start_us = span.start_time_unix_nano // 1000
        end_us = span.end_time_unix_nano // 1000 if span.end_time_unix_nano else None
        name = span.name
        reward_value, reward_name = _reward(name, attrs)
        input_messages = _messages_json(attrs.get(A.GEN_AI_INPUT_MESSAGES))
        output_messages = _messages_json(attrs.get(A.GEN_AI_OUTPUT_MESSAGES))
        flat = input_messages is None or output_messages is None
        if flat:
            flat = any(k.startswith(_FLAT_MESSAGE_PREFIXES) for k in attrs)
        if input_messages is None and flat:
            input_messages = _indexed_messages(
                attrs, A.OI_LLM_INPUT_MESSAGES_PREFIX, A.OI_MESSAGE_ROLE_SUFFIX, A.OI_MESSAGE_CONTENT_SUFFIX
            ) or _indexed_messages(attrs, A.GEN_AI_PROMPT_PREFIX_OLD, "role", "content")
        if output_messages is None and flat:
            output_messages = _indexed_messages(
                attrs, A.OI_LLM_OUTPUT_MESSAGES_PREFIX, A.OI_MESSAGE_ROLE_SUFFIX, A.OI_MESSAGE_CONTENT_SUFFIX
            ) or _indexed_messages(attrs, A.GEN_AI_COMPLETION_PREFIX_OLD, "role", "content")
        rest = {k: v for k, v in attrs.items() if k not in _TYPED_KEYS} if attrs else None
        parent = span.parent_span_id.hex() if span.parent_span_id else None
        rows.append(
            (
                tenant,
                trace_hex,
                span.span_id.hex(),
                parent,
                name,
                _KINDS.get(span.kind, "UNSPECIFIED"),
                start_us,
                end_us,
                _STATUS.get(span.status.code, "UNSET"),
                span.status.message or None,
                _str(res.get(A.SERVICE_NAME)),
                str(rollout),
                _str(_first(A.ATTEMPT_ID_KEYS, attrs, res)),
                _str(_first((A.TASK_ID,), attrs, res)),
                _str(_first(A.AGENT_NAME_KEYS, attrs, res)),
                _str(attrs.get(A.ROLLOUT_STATUS)),
                _str(_first(A.RESPONSE_ID_KEYS, attrs)),
                _str(_first(A.MODEL_KEYS, attrs)),
                _str(attrs.get(A.LLM_POLICY_VERSION)),
                _int_list(_first(A.PROMPT_TOKEN_IDS_KEYS, attrs)),
                _int_list(_first(A.COMPLETION_TOKEN_IDS_KEYS, attrs)),
                _float_list(attrs.get(A.LLM_COMPLETION_LOGPROBS)),
                input_messages,
                output_messages,
                reward_value,
                reward_name,
                json.dumps(rest, default=_json_default) if rest else None,
                json.dumps(res, default=_json_default) if res else None,
                received_us,
                rec.topic,
                rec.partition,
                rec.offset,
                start_us // _US_PER_DAY,
            )
        )
    return rows


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
    tenant = ev.get("tenant") or rec.header(topics.HEADER_TENANT) or topics.DEFAULT_TENANT
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
