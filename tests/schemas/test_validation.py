"""Record validation and span checks: hostile values are refused with the field named, never raised as
another exception (which a receiver would answer with a 500)."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from schemas import attributes as A
from schemas import span_checks
from schemas.errors import RecordValidationError
from schemas.validation import validate_reward_event

OK_NS = 1_700_000_000_000_000_000


@pytest.mark.parametrize(
    "event, field",
    [
        ({"value": 10**400, "rollout_id": "r"}, "value"),  # float(10**400) raises OverflowError
        ({"value": -(10**400), "rollout_id": "r"}, "value"),
        ({"value": 1, "rollout_id": "r", "timestamp": "0001-01-01T00:00:00+01:00"}, "timestamp"),  # year 0 in UTC
        ({"value": 1, "rollout_id": "r", "timestamp": "9999-12-31T23:30:00-01:00"}, "timestamp"),  # year 10000
        ({"value": 1, "rollout_id": "\ud800"}, "rollout_id"),  # no UTF-8 encoder takes a lone surrogate
        ({"value": 1, "rollout_id": "r", "name": "ok\udfffok"}, "name"),
    ],
)
def test_hostile_reward_values_name_the_field(event: dict[str, object], field: str) -> None:
    with pytest.raises(RecordValidationError) as info:
        validate_reward_event(event)
    assert info.value.field == field
    str(info.value).encode("utf-8", "backslashreplace")  # the message itself stays printable


def test_reasonable_reward_values_still_pass() -> None:
    out = validate_reward_event(
        {"value": 10**20, "rollout_id": "é-rollout", "timestamp": "2025-01-01T00:30:00+01:00", "name": "π"}
    )
    assert out["value"] == 1e20 and out["rollout_id"] == "é-rollout"
    assert out["timestamp"] == dt.datetime(2024, 12, 31, 23, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize("when", ["0001-01-02T00:00:00+01:00", "1970-01-01T00:00:00Z", 0, 2**63 - 1])
def test_reward_times_outside_the_span_window_are_refused(when: object) -> None:
    """Parseable, but a broken clock or a unit mistake: refused like span times of 0 or 2**64-1 ns."""
    with pytest.raises(RecordValidationError) as info:
        validate_reward_event({"value": 1, "rollout_id": "r", "timestamp": when})
    assert info.value.field == "timestamp"


def test_span_kind_status_and_times() -> None:
    assert span_checks.kind_problem(5) is None and span_checks.status_problem(2) is None
    assert "kind" in (span_checks.kind_problem(6) or "")
    assert "status.code" in (span_checks.status_problem(-1) or "")
    assert span_checks.times_problem(OK_NS, 0) is None  # not ended: ingestion stores a null end
    assert span_checks.times_problem(OK_NS, OK_NS) is None
    for start, end, field in [
        (0, 0, "start_time_unix_nano"),
        (2**64 - 1, 0, "start_time_unix_nano"),  # would be stored as the year 2554
        (OK_NS, 2**64 - 1, "end_time_unix_nano"),
        (OK_NS, OK_NS - 1, "end_time_unix_nano"),
    ]:
        assert (span_checks.times_problem(start, end) or "").startswith(field), (start, end)


@pytest.mark.parametrize(
    "value, ok",
    [
        ([0, 1, 2**31 - 1], True),
        ([], True),
        ("[1, 2, 3]", True),  # SDKs that only write strings send a JSON list
        ([-1], False),
        ([2**31], False),
        ([1, "2"], False),
        ([True], False),
        ([1.0], False),
        ([1, None], False),
        ("[1, -2]", False),
        ("not json", False),
        (7, False),
        ({"a": 1}, False),
    ],
)
def test_token_ids(value: object, ok: bool) -> None:
    assert (span_checks.token_ids_problem(value) is None) is ok


@pytest.mark.parametrize(
    "value, ok",
    [
        ([-0.5, 0, -3], True),
        ("[-0.5, -1e-3]", True),
        ([-math.inf], True),
        (["a"], False),
        ([math.nan], False),
        ([None], False),
        ([[1.0]], False),
        ("{", False),
        (0.5, False),
    ],
)
def test_logprobs(value: object, ok: bool) -> None:
    assert (span_checks.logprobs_problem(value) is None) is ok


@pytest.mark.parametrize(
    "value, ok",
    [(1, True), (0.25, True), ("0.5", True), (True, True), ("abc", False), (math.inf, False), ("nan", False)]
    + [(10**400, False), ([1], False), ({"v": 1}, False), (None, False)],
)
def test_reward_value(value: object, ok: bool) -> None:
    assert (span_checks.reward_value_problem(value) is None) is ok


def test_attributes_are_read_the_way_ingestion_picks_them() -> None:
    # an empty string is skipped, so the next convention's key is the one read
    assert span_checks.attributes_problem("llm", {A.LLM_PROMPT_TOKEN_IDS: "", A.AGL_PROMPT_TOKEN_IDS: [-1]}) == (
        f"attributes[{A.AGL_PROMPT_TOKEN_IDS}]: item 0 is -1, token ids are between 0 and 2**31-1"
    )
    # the first present key wins: a later one is not read, so it is not judged
    later_is_unread = {A.LLM_COMPLETION_TOKEN_IDS: [1], A.AGL_RESPONSE_TOKEN_IDS: "x"}
    assert span_checks.attributes_problem("llm", later_is_unread) is None
    assert "completion_logprobs" in (span_checks.attributes_problem("llm", {A.LLM_COMPLETION_LOGPROBS: ""}) or "")
    # a reward value only counts on a reward span
    assert span_checks.attributes_problem("tool", {A.REWARD_VALUE: "abc"}) is None
    assert A.REWARD_VALUE in (span_checks.attributes_problem(A.REWARD_SPAN_NAME, {A.REWARD_VALUE: "abc"}) or "")
    agl = {f"{A.AGL_REWARD_PREFIX}.0.value": [1.0]}
    assert "agentlightning.reward.0.value" in (span_checks.attributes_problem(A.AGL_REWARD_SPAN_NAME, agl) or "")
