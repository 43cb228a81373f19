"""What makes one OTLP span unusable for the lake: pure checks, one rule for whoever applies it.

The collector applies them as spans arrive and refuses a span that fails (OTLP partial success, or
400 when every span of a request fails), so nothing it acknowledges is quarantined later. They
state the rules ingestion (``pipelines/bronze/decoding``) quarantines a record by: token ids are integers
in ``[0, 2**31)`` (stored as int32), logprobs are numbers, a reward value is a number, either as an
OTLP array or as a string holding a JSON list (some SDKs only write strings); which attribute is
read among several conventions follows ``first_present``, as ingestion picks it. They add what the
OTLP data model requires and ingestion would store wrongly rather than refuse: a known span kind and
status code, and a start time (end time, when set) that is a real date, not 0 or 2**64-1 ns.

Values are plain Python, as an OTLP ``AnyValue`` decodes: int, float, str, bool, bytes, list,
dict or None. Each check returns None when the value is fine, else a message that names the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from schemas import attributes as A

SPAN_KINDS: dict[int, str] = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES: dict[int, str] = {0: "UNSET", 1: "OK", 2: "ERROR"}

# Span times outside these years are a broken clock or an unset field, not an agent's rollout.
MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01T00:00:00Z
MAX_TIME_NS = 4_102_444_800 * 10**9  # 2100-01-01T00:00:00Z
TOKEN_ID_LIMIT = 2**31  # token id columns are int32
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)

TOKEN_ID_KEYS: tuple[tuple[str, ...], ...] = (A.PROMPT_TOKEN_IDS_KEYS, A.COMPLETION_TOKEN_IDS_KEYS)
LOGPROB_KEYS: tuple[str, ...] = (A.LLM_COMPLETION_LOGPROBS,)
AGL_FIRST_REWARD = f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_VALUE_SUFFIX}"
# Every attribute key a check reads: a span with none of them needs no attribute decoding at all.
CHECKED_KEYS: frozenset[str] = frozenset(
    {
        *A.PROMPT_TOKEN_IDS_KEYS,
        *A.COMPLETION_TOKEN_IDS_KEYS,
        *LOGPROB_KEYS,
        A.REWARD_VALUE,
        A.AGL_LEGACY_REWARD,
        AGL_FIRST_REWARD,
    }
)


def ids_problem(trace_id: bytes, span_id: bytes) -> str | None:
    """OTLP ids: 16 and 8 bytes, not all zero (the partition key and the span's identity)."""
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return "trace_id must be 16 bytes and not all zero"
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return "span_id must be 8 bytes and not all zero"
    return None


def kind_problem(kind: int) -> str | None:
    """A SpanKind the data model defines (proto3 enums let any int through the wire)."""
    if kind not in SPAN_KINDS:
        return f"kind: {kind} is not a SpanKind (0 to {max(SPAN_KINDS)})"
    return None


def status_problem(code: int) -> str | None:
    """A Status.StatusCode the data model defines."""
    if code not in STATUS_CODES:
        return f"status.code: {code} is not a StatusCode (0 to {max(STATUS_CODES)})"
    return None


def _time_text(ns: int) -> str:
    return f"{ns} ns is not between 2000-01-01 and 2100-01-01"


def times_problem(start_ns: int, end_ns: int) -> str | None:
    """A start time in range; an end time that is 0 (not ended: stored as null) or in range and not before it."""
    if not MIN_TIME_NS <= start_ns < MAX_TIME_NS:
        return f"start_time_unix_nano: {_time_text(start_ns)}"
    if end_ns == 0:
        return None
    if not MIN_TIME_NS <= end_ns < MAX_TIME_NS:
        return f"end_time_unix_nano: {_time_text(end_ns)}"
    if end_ns < start_ns:
        return f"end_time_unix_nano: {end_ns} is before start_time_unix_nano {start_ns}"
    return None


def _as_list(value: Any) -> tuple[list[Any] | None, str | None]:
    """An array attribute, or a string that holds a JSON list; else the reason it is neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None, "a string that is not a JSON list"
    if isinstance(value, list | tuple):
        return list(value), None
    return None, f"a {type(value).__name__}, not a list"


def token_ids_problem(value: Any) -> str | None:
    """Token ids: a list (or JSON list string) of integers in ``[0, 2**31)``."""
    items, why = _as_list(value)
    if items is None:
        return f"expected a list of token ids, got {why}"
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, int):
            return f"item {i} is {type(x).__name__ if x is not None else 'empty'}, token ids are integers"
        if not 0 <= x < TOKEN_ID_LIMIT:
            return f"item {i} is {x}, token ids are between 0 and 2**31-1"
    return None


def logprobs_problem(value: Any) -> str | None:
    """Logprobs: a list (or JSON list string) of numbers, none NaN."""
    items, why = _as_list(value)
    if items is None:
        return f"expected a list of logprobs, got {why}"
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, int | float):
            return f"item {i} is {type(x).__name__ if x is not None else 'empty'}, logprobs are numbers"
        if isinstance(x, float) and math.isnan(x):
            return f"item {i} is NaN, logprobs are numbers"
    return None


def reward_value_problem(value: Any) -> str | None:
    """A reward: a finite number, or a string holding one (rewards events refuse NaN and infinity too)."""
    if isinstance(value, bool):
        return None  # float(True): ingestion reads it as 1.0
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return f"{value[:40]!r} is not a number"
    if not isinstance(value, int | float):
        return f"expected a number, got {type(value).__name__}"
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    return None if finite else f"{value if isinstance(value, float) else 'an integer'} is not a finite number"


def first_present(keys: Sequence[str], attrs: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The first of ``keys`` whose value is neither None nor an empty string: the one ingestion reads."""
    for k in keys:
        v = attrs.get(k)
        if v is not None and (not isinstance(v, str) or v):
            return k, v
    return None


def reward_attribute(name: str, attrs: Mapping[str, Any]) -> tuple[str, Any] | None:
    """Which attribute holds the reward of a reward span (ours, or Agent Lightning's): (key, value).

    The one rule: the collector checks that value and ingestion stores it."""
    if name == A.REWARD_SPAN_NAME:
        value = attrs.get(A.REWARD_VALUE)
        return None if value is None else (A.REWARD_VALUE, value)
    if name == A.AGL_REWARD_SPAN_NAME:
        for key in (AGL_FIRST_REWARD, A.AGL_LEGACY_REWARD):
            if attrs.get(key) is not None:
                return key, attrs[key]
    return None


def attributes_problem(name: str, attrs: Mapping[str, Any]) -> str | None:
    """Token ids, logprobs and the reward of a span named ``name``, read the way ingestion reads them."""
    for keys in TOKEN_ID_KEYS:
        picked = first_present(keys, attrs)
        if picked is not None and (why := token_ids_problem(picked[1])) is not None:
            return f"attributes[{picked[0]}]: {why}"
    for key in LOGPROB_KEYS:
        value = attrs.get(key)
        if value is not None and (why := logprobs_problem(value)) is not None:
            return f"attributes[{key}]: {why}"
    reward = reward_attribute(name, attrs)
    if reward is not None and (why := reward_value_problem(reward[1])) is not None:
        return f"attributes[{reward[0]}]: {why}"
    return None
