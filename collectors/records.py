"""Decode OTLP and reward bodies into Kafka records. Pure: no Kafka client, no server.

A span record holds the spans of one trace from one request, with resource and scope kept as
sent, as a serialized ``ExportTraceServiceRequest``; its key is the trace id in lowercase hex, so
every piece of one trace stays ordered in one partition (the rollout is resolved by the pipeline).
Records are built by concatenating protobuf encodings (``schemas.otlp.wire``), so spans are
copied byte for byte instead of being rebuilt field by field.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collectors.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType, safe_text
from schemas import span_checks, topics
from schemas.errors import RecordValidationError
from schemas.otlp import packed, wire
from schemas.otlp.values import any_value
from schemas.tables import REWARD_EVENT, SPANS, schema_version
from schemas.validation import validate_reward_event

BodyFormat = Literal["protobuf", "json"]

SPANS_SCHEMA_VERSION = str(schema_version(SPANS)).encode()
REWARDS_SCHEMA_VERSION = str(schema_version(REWARD_EVENT)).encode()
_SPANS_CONTENT_TYPE = topics.SPANS_CONTENT_TYPE.encode()
_JSON_CONTENT_TYPE = topics.JSON_CONTENT_TYPE.encode()


@dataclass(slots=True)
class Record:
    """One Kafka record to produce; ``spans`` counts the spans it carries (0 for rewards)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    spans: int = 0


@dataclass(slots=True)
class TraceSplit:
    """What a trace export request became: records, and the spans we refused with why."""

    records: list[Record] = field(default_factory=list)
    accepted_spans: int = 0
    rejected_spans: int = 0
    error_message: str = ""


def body_format(content_type: str | None) -> BodyFormat:
    """Map a Content-Type header to the OTLP encoding; 415 for anything else."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return "protobuf"
    if media == "application/json":
        return "json"
    raise UnsupportedMediaType(
        f"unsupported content type {content_type!r}; send application/x-protobuf or application/json"
    )


def decompress(body: bytes, encoding: str | None, *, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (identity or gzip), refusing output over ``limit`` bytes.

    A gzip body may hold several members back to back (RFC 1952; ``cat a.gz b.gz``): all of them
    are read, so spans in a later member are never dropped, and their total is what ``limit`` bounds.
    """
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        if len(body) > limit:
            raise PayloadTooLarge(f"body of {len(body)} bytes is over the limit of {limit} bytes")
        return body
    if enc not in ("gzip", "x-gzip"):
        raise UnsupportedMediaType(f"unsupported content encoding {encoding!r}; use gzip or none")
    return _gunzip(body, limit)


_GZIP_CHUNK = 64 << 10


def _gunzip(body: bytes, limit: int) -> bytes:
    """Every gzip member of ``body``, concatenated; 413 past ``limit`` bytes, 400 when corrupt or cut.

    Input goes in 64 KiB at a time, so a body of many tiny members costs time linear in its size.
    """
    out: list[bytes] = []
    size = 0
    pos = 0
    pending = b""
    inflater = zlib.decompressobj(wbits=31)
    started = False  # the current member has begun (zero padding between members does not count)
    members = 0
    while True:
        if not pending:
            if pos >= len(body):
                break
            pending = body[pos : pos + _GZIP_CHUNK]
            pos += _GZIP_CHUNK
        if not started:
            pending = pending.lstrip(b"\0") if members else pending  # gzip(1) allows zeros after a member
            if not pending:
                continue
            started = True
        try:
            chunk = inflater.decompress(pending, limit + 1 - size)
        except zlib.error as exc:
            raise BadRequest(f"gzip body is corrupt (member {members + 1}): {exc}") from exc
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"decompressed body is over the limit of {limit} bytes")
        out.append(chunk)
        pending = b""
        if inflater.eof:
            members += 1
            pending = inflater.unused_data
            inflater = zlib.decompressobj(wbits=31)
            started = False
    if started or not members:
        raise BadRequest("gzip body is truncated")
    return b"".join(out)


# --- OTLP JSON ----------------------------------------------------------------------------------
# OTLP JSON differs from protobuf's canonical JSON in one way that matters: trace and span ids are
# hex strings, not base64. We rewrite them to base64 before handing the dict to json_format.


def _hex_to_b64(value: Any, path: str) -> Any:
    if not isinstance(value, str):
        return value  # json_format reports the type error with the field name
    try:
        raw = bytes.fromhex(value)
    except ValueError as exc:
        raise BadRequest(f"{path}: expected a hex string, got {value[:40]!r}") from exc
    return base64.b64encode(raw).decode()


def _fix_ids(obj: dict[str, Any], keys: tuple[str, ...], path: str) -> None:
    for k in keys:
        if k in obj:
            obj[k] = _hex_to_b64(obj[k], f"{path}.{k}")


def _list(obj: Any, key: str, path: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise BadRequest(f"{path}: expected an object, got {type(obj).__name__}")
    value = obj.get(key, obj.get(_snake(key), []))
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{path}.{key}: expected a list, got {type(value).__name__}")
    return value


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


_SPAN_KIND_NAMES = frozenset(Span.SpanKind.keys())
_STATUS_CODE_NAMES = frozenset(Status.StatusCode.keys())


def _check_enum(obj: dict[str, Any], key: str, names: frozenset[str], path: str) -> None:
    """An enum given by name must be a known name: protobuf's JSON parser, told to ignore unknown
    fields (as OTLP receivers must), would silently read an unknown name as 0."""
    value = obj.get(key)
    if isinstance(value, str) and value not in names:
        raise BadRequest(f"{path}.{key}: {value[:40]!r} is not one of {', '.join(sorted(names))}")


def _check_span_json(span: Any, path: str) -> None:
    if not isinstance(span, dict):
        raise BadRequest(f"{path}: expected an object, got {type(span).__name__}")
    _fix_ids(span, ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"), path)
    _check_enum(span, "kind", _SPAN_KIND_NAMES, path)
    status = span.get("status")
    if isinstance(status, dict):
        _check_enum(status, "code", _STATUS_CODE_NAMES, f"{path}.status")
    for n, link in enumerate(_list(span, "links", path)):
        if not isinstance(link, dict):
            raise BadRequest(f"{path}.links[{n}]: expected an object")
        _fix_ids(link, ("traceId", "spanId", "trace_id", "span_id"), f"{path}.links[{n}]")


def _otlp_json_to_dict(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadRequest(f"expected a JSON object at the top level, got {type(data).__name__}")
    for i, rs in enumerate(_list(data, "resourceSpans", "")):
        for j, ss in enumerate(_list(rs, "scopeSpans", f"resourceSpans[{i}]")):
            for k, span in enumerate(_list(ss, "spans", f"resourceSpans[{i}].scopeSpans[{j}]")):
                _check_span_json(span, f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]")
    return data


# A JSON string may spell a UTF-16 surrogate as an escape; json.loads joins pairs into one character
# and leaves a lone one in the string, which no UTF-8 encoder (protobuf, Kafka keys) will take.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate_at(data: Any) -> str | None:
    """The path of the first string (key or value) in decoded JSON that holds a lone surrogate."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return path or "<body>"
        elif isinstance(value, dict):
            for k, v in value.items():
                if not k.isascii():
                    try:
                        k.encode("utf-8")
                    except UnicodeEncodeError:
                        return f"{path}.{safe_text(k)[:40]}".lstrip(".") + " (the key)"
                stack.append((f"{path}.{k}".lstrip("."), v))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def load_json(body: bytes) -> Any:
    """``json.loads`` that refuses what the rest of the path could not encode: 400 naming the field."""
    try:
        text = body.decode("utf-8-sig")  # strict: json.loads(bytes) would let raw surrogates through
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body is not UTF-8 JSON: {exc}") from exc
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(body) is not None:
        where = _lone_surrogate_at(data)
        if where is not None:
            raise BadRequest(f"{where}: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode")
    return data


def decode_traces(body: bytes, fmt: BodyFormat) -> ExportTraceServiceRequest:
    """Parse an OTLP trace export body; ``BadRequest`` names what is wrong."""
    request = ExportTraceServiceRequest()
    if fmt == "protobuf":
        try:
            request.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise BadRequest(f"body is not a valid OTLP ExportTraceServiceRequest protobuf: {exc}") from exc
        return request
    data = _otlp_json_to_dict(load_json(body))
    try:
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (
        json_format.ParseError,
        ValueError,
        TypeError,
        AttributeError,
        RecursionError,
        UnicodeError,
        SystemError,  # protobuf's C parser on strings it cannot convert; kept as a 400 should another appear
    ) as exc:
        raise BadRequest(f"body is not a valid OTLP JSON trace export: {exc}") from exc
    return request


def encode_response(fmt: BodyFormat, rejected_spans: int = 0, error_message: str = "") -> bytes:
    """The ExportTraceServiceResponse, with ``partial_success`` when spans were refused."""
    response = ExportTraceServiceResponse()
    if rejected_spans or error_message:
        response.partial_success.rejected_spans = rejected_spans
        response.partial_success.error_message = safe_text(error_message)
    if fmt == "protobuf":
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


# --- splitting a request into one record per trace ----------------------------------------------


def _checked_value(key: str, value: AnyValue) -> Any:
    """``value`` as ``span_checks`` reads it. A token array whose bytes show it passes stands in as []:
    reading thousands of items one by one cost 15 times the rest of the span."""
    if key in packed.PACKED_KEYS and value.WhichOneof("value") == "array_value":
        clean = packed.clean_token_ids if key in packed.TOKEN_ID_KEYS else packed.clean_logprobs
        if clean(value.array_value.SerializeToString()):
            return []
    return any_value(value)


def _checked_attributes(span: Span) -> dict[str, Any]:
    """The span's attributes that ``span_checks`` reads, decoded; the others are left as bytes."""
    keys = span_checks.CHECKED_KEYS
    return {kv.key: _checked_value(kv.key, kv.value) for kv in span.attributes if kv.key in keys}


def span_problem(span: Span, *, strict: bool, attributes: bool) -> str | None:
    """Why ``span`` cannot be stored, naming the field; ids only unless ``strict`` (see ``split_traces``)."""
    problem = span_checks.ids_problem(span.trace_id, span.span_id)
    if problem is not None or not strict:
        return problem
    problem = (
        span_checks.kind_problem(span.kind)
        or span_checks.status_problem(span.status.code)
        or span_checks.times_problem(span.start_time_unix_nano, span.end_time_unix_nano)
    )
    if problem is None and attributes:
        problem = span_checks.attributes_problem(span.name, _checked_attributes(span))
    return problem


_CHECKED_KEY_BYTES = tuple(k.encode() for k in span_checks.CHECKED_KEYS)


def mentions_checked_keys(body: bytes) -> bool:
    """Whether a body may carry an attribute ``span_checks`` reads: if not, no attribute is decoded.

    Protobuf keeps keys as plain bytes; a JSON body could hide one behind ``\\u`` escapes, so those count.
    """
    return b"\\u" in body or any(k in body for k in _CHECKED_KEY_BYTES)


def split_traces(
    request: ExportTraceServiceRequest,
    *,
    tenant: str,
    topic: str,
    received_at_ns: int,
    original: bytes | None = None,
    strict: bool = False,
    check_attributes: bool = True,
) -> TraceSplit:
    """One record per trace in ``request``; spans with invalid ids are counted as rejected.

    ``strict`` (the receivers) also refuses every span ``schemas.span_checks`` finds unusable (kind,
    status, times, token ids, logprobs, reward), so nothing acknowledged is quarantined by ingestion;
    ``check_attributes=False`` skips decoding attributes when the body names none of the checked keys.
    ``original`` is the protobuf body the request was parsed from: when the request holds a
    single trace and nothing was rejected, it becomes the record value unchanged.
    """
    out = TraceSplit()
    # trace id -> {resource index -> {scope index -> [span bytes]}}
    groups: dict[bytes, dict[int, dict[int, list[bytes]]]] = {}
    counts: dict[bytes, int] = {}
    problems: list[str] = []
    resources = request.resource_spans
    single_pass_ok = True
    for ri, rs in enumerate(resources):
        for si, ss in enumerate(rs.scope_spans):
            for k, span in enumerate(ss.spans):
                tid = span.trace_id
                problem = span_problem(span, strict=strict, attributes=check_attributes)
                if problem is not None:
                    out.rejected_spans += 1
                    if len(problems) < 3:
                        where = f"resource_spans[{ri}].scope_spans[{si}].spans[{k}]"
                        problems.append(f"span {span.name[:60]!r} ({where}): {problem}")
                    single_pass_ok = False
                    continue
                by_res = groups.get(tid)
                if by_res is None:
                    by_res = groups[tid] = {}
                    counts[tid] = 0
                by_res.setdefault(ri, {}).setdefault(si, []).append(span.SerializeToString())
                counts[tid] += 1
    if problems:
        out.error_message = "; ".join(problems) + (
            f" (and {out.rejected_spans - len(problems)} more)" if out.rejected_spans > len(problems) else ""
        )
    received = str(received_at_ns).encode()
    headers_base = [
        (topics.HEADER_TENANT, tenant.encode()),
        (topics.HEADER_SCHEMA_VERSION, SPANS_SCHEMA_VERSION),
        (topics.HEADER_RECEIVED_AT, received),
        (topics.HEADER_CONTENT_TYPE, _SPANS_CONTENT_TYPE),
    ]
    whole = original if single_pass_ok and len(groups) == 1 else None  # the request as sent is the record
    resource_heads: dict[int, bytes] = {}
    scope_heads: dict[tuple[int, int], bytes] = {}
    for tid, by_res in groups.items():
        # Keyed by trace id, never by rollout id: the id may arrive in a later request (on the root),
        # and every piece of one trace must land in the same partition, in order. Which rollout a
        # trace belongs to is decided once, by the pipeline (`pipelines/silver/identity.py`).
        key = tid.hex().encode()
        if whole is not None:
            value = whole
        else:
            parts = []
            for ri, by_scope in by_res.items():
                rs = resources[ri]
                head = resource_heads.get(ri)
                if head is None:
                    head = resource_heads[ri] = wire.resource_head(rs)
                scopes = []
                for si, spans in by_scope.items():
                    shead = scope_heads.get((ri, si))
                    if shead is None:
                        shead = scope_heads[ri, si] = wire.scope_head(rs.scope_spans[si])
                    scopes.append(wire.scope_spans(shead, spans))
                parts.append(wire.resource_spans(head, scopes, wire.resource_tail(rs)))
            value = b"".join(parts)
        out.records.append(Record(topic, key, value, list(headers_base), counts[tid]))
        out.accepted_spans += counts[tid]
    return out


# --- reward events ------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    raise TypeError(f"cannot encode {type(value).__name__}")


def reward_records(body: bytes, *, tenant: str, topic: str, received_at_ns: int) -> list[Record]:
    """Validate a JSON reward event (or a list of them) into records keyed by what they name.

    The tenant comes from the caller's token, never from the body: a body that names another
    tenant is refused rather than silently rewritten.
    """
    data = load_json(body)
    events: Sequence[Any] = data if isinstance(data, list) else [data]
    if not events:
        raise BadRequest("no reward events: send a JSON object or a non-empty list of them")
    received = dt.datetime.fromtimestamp(received_at_ns / 1e9, dt.UTC)
    headers = [
        (topics.HEADER_TENANT, tenant.encode()),
        (topics.HEADER_SCHEMA_VERSION, REWARDS_SCHEMA_VERSION),
        (topics.HEADER_RECEIVED_AT, str(received_at_ns).encode()),
        (topics.HEADER_CONTENT_TYPE, _JSON_CONTENT_TYPE),
    ]
    out = []
    for i, event in enumerate(events):
        prefix = f"[{i}]." if isinstance(data, list) else ""
        if isinstance(event, dict) and event.get("tenant") not in (None, tenant):
            raise BadRequest(f"{prefix}tenant: the tenant comes from your token; leave it out")
        try:
            record = validate_reward_event({**event, "tenant": tenant} if isinstance(event, dict) else event)
        except RecordValidationError as exc:
            raise BadRequest(f"{prefix}{exc}") from exc
        if record.get("timestamp") is None:
            record["timestamp"] = received
        key: str = record.get("rollout_id") or record.get("trace_id") or record["response_id"]
        value = json.dumps(record, default=_json_default, separators=(",", ":")).encode()
        out.append(Record(topic, key.encode(), value, list(headers)))
    return out
