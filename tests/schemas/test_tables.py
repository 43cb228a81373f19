"""Every schema is versioned, round-trips through Arrow and Delta, and rejects bad records by field."""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import schemas
from schemas import tables
from schemas.errors import RecordValidationError
from schemas.validation import to_table, validate_record, validate_reward_event

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def test_every_schema_has_name_and_version() -> None:
    for name, schema in {**tables.TABLES, **tables.EVENTS}.items():
        assert schema.metadata[tables.SCHEMA_NAME_KEY] == name.encode()
        assert tables.schema_version(schema) >= 1


def test_partition_columns_exist() -> None:
    for name, cols in tables.PARTITION_COLUMNS.items():
        for col in cols:
            assert col in tables.TABLES[name].names


def _transition(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "transition_id": "r1/a1/0",
        "rollout_id": "r1",
        "attempt_id": "a1",
        "tenant": "default",
        "task_id": "t1",
        "group_id": "t1",
        "step": 0,
        "agent_name": "math",
        "prompt_ids": [1, 2, 3],
        "response_ids": [4, 5],
        "response_logprobs": [-0.5, -1.25],
        "loss_mask": [1, 1],
        "reward": 1.0,
        "return": 1.0,
        "advantage": 0.5,
        "policy_version": "v0001",
        "llm_model": "agentlake-policy",
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "created_at": NOW,
        "day": NOW.date(),
    }
    row.update(over)
    return row


def test_transition_round_trips_through_delta(tmp_path) -> None:
    table = to_table([_transition(), _transition(transition_id="r1/a1/1", step=1)], tables.TRANSITIONS)
    write_deltalake(str(tmp_path / "t"), table, partition_by=tables.PARTITION_COLUMNS["transitions"])
    back = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert back.num_rows == 2
    assert sorted(back.column("step").to_pylist()) == [0, 1]
    row = back.filter(pa.compute.equal(back["step"], 0)).to_pylist()[0]
    assert row["prompt_ids"] == [1, 2, 3]
    assert row["response_logprobs"] == [-0.5, -1.25]
    assert row["created_at"] == NOW


def test_spans_row_with_nested_lists_round_trips() -> None:
    row = {f.name: None for f in tables.SPANS}
    row.update(
        tenant="t",
        trace_id="a" * 32,
        span_id="b" * 16,
        name="chat",
        start_time=NOW,
        rollout_id="r",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_logprobs=[-0.1],
        day=NOW.date(),
    )
    table = to_table([row], tables.SPANS)
    assert table.schema.equals(tables.SPANS, check_metadata=False)
    assert table.to_pylist()[0]["completion_token_ids"] == [3]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("step", "zero", "expected an integer"),
        ("step", 2**40, "outside the range"),
        ("reward", math.nan, "finite"),
        ("reward", True, "expected a number"),
        ("prompt_ids", "1 2 3", "expected a list"),
        ("created_at", "yesterday", "ISO 8601"),
        ("created_at", "2026-11-22T12:00:00", "time zone"),
        ("rollout_id", None, "required"),
    ],
)
def test_bad_transition_names_the_field(field: str, value: object, needle: str) -> None:
    with pytest.raises(RecordValidationError) as info:
        validate_record(_transition(**{field: value}), tables.TRANSITIONS)
    assert info.value.field == field
    assert needle in str(info.value)


def test_bad_list_item_names_index() -> None:
    with pytest.raises(RecordValidationError) as info:
        validate_record(_transition(prompt_ids=[1, "x", 3]), tables.TRANSITIONS)
    assert info.value.field == "prompt_ids[1]"


def test_unknown_field_is_rejected() -> None:
    with pytest.raises(RecordValidationError) as info:
        validate_record(_transition(rewrd=1.0), tables.TRANSITIONS)
    assert info.value.field == "rewrd"
    assert "unknown field" in str(info.value)


def test_non_object_record() -> None:
    with pytest.raises(RecordValidationError, match="JSON object"):
        validate_record([1, 2], tables.REWARD_EVENT)


def test_reward_event_defaults_and_normalizes() -> None:
    event = validate_reward_event({"value": 1, "trace_id": "AB" * 16})
    assert event["name"] == "primary"
    assert event["value"] == 1.0
    assert event["trace_id"] == "ab" * 16
    stamped = validate_reward_event({"value": 0.5, "rollout_id": "r", "timestamp": "2026-11-22T12:00:00Z"})
    assert stamped["timestamp"] == NOW


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"value": 1.0}, "rollout_id"),
        ({"rollout_id": "r"}, "value"),
        ({"value": "high", "rollout_id": "r"}, "value"),
        ({"value": 1.0, "trace_id": "xyz"}, "trace_id"),
        ({"value": 1.0, "rollout_id": 7}, "rollout_id"),
        ({"value": 1.0, "rollout_id": "r", "extra": 1}, "extra"),
    ],
)
def test_bad_reward_events(event: dict[str, object], field: str) -> None:
    with pytest.raises(RecordValidationError) as info:
        validate_reward_event(event)
    assert info.value.field == field


def test_public_names_are_exported() -> None:
    assert sorted(schemas.__all__) == sorted(set(schemas.__all__))
    for name in schemas.__all__:
        assert hasattr(schemas, name)


def test_schemas_imports_nothing_of_ours() -> None:
    import pathlib
    import re

    root = pathlib.Path(schemas.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+(agentlake|collectors|pipelines|trainer)\b", text, re.M), path


def test_spans_v3_to_v5_columns_come_last_and_nullable() -> None:
    """v3 adds `redacted` (pipelines.bronze.redact), v4 `policy_sha256` (the served adapter's manifest hash),
    v5 `tools` (the request's tool definitions), each last and nullable: an older table gains them by a
    schema merge."""
    assert tables.schema_version(tables.SPANS) == 5
    field = tables.SPANS.field("redacted")
    assert field.type == pa.list_(pa.string()) and field.nullable
    assert tables.SPANS.names[-3:] == ["redacted", "policy_sha256", "tools"]
    assert tables.SPANS.field("policy_sha256").nullable and tables.SPANS.field("tools").nullable


def test_policy_sha256_and_tools_flow_as_the_last_nullable_fields_of_calls_and_transitions() -> None:
    """Added last and nullable in trajectories' calls (v2: policy_sha256, v3: tools) and transitions (v4),
    as `policy_version` flows."""
    assert tables.schema_version(tables.TRAJECTORIES) == 3 and tables.schema_version(tables.TRANSITIONS) >= 4
    call = tables.LLM_CALL
    assert [call[i].name for i in (call.num_fields - 2, call.num_fields - 1)] == ["policy_sha256", "tools"]
    assert call[call.num_fields - 2].nullable and call[call.num_fields - 1].nullable
    assert tables.TRANSITIONS.names[-2] == "policy_sha256" and tables.TRANSITIONS.field("policy_sha256").nullable


def test_token_status_is_the_last_nullable_field_of_transitions() -> None:
    """v5: how a row's tokens are known (pipelines.gold.token_check), last and nullable (older rows)."""
    assert tables.schema_version(tables.TRANSITIONS) == 5
    assert tables.TRANSITIONS.names[-1] == "token_status" and tables.TRANSITIONS.field("token_status").nullable
