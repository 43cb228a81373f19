"""A table written under an older schema version takes writes of the current one, and is read as one."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import write_deltalake

from pipelines.gold.transitions import build
from schemas.config import CreditSettings
from schemas.lake import Lake
from schemas.tables import LLM_CALL, TRAJECTORIES, TRANSITIONS


def test_a_transitions_table_from_before_the_baseline_column_gains_it(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    v1 = TRANSITIONS.remove(TRANSITIONS.get_field_index("baseline"))
    write_deltalake(lake.uri("transitions"), v1.empty_table(), partition_by=["day"])
    row = dict.fromkeys(TRANSITIONS.names)
    row |= {
        "transition_id": "r/a/0",
        "rollout_id": "r",
        "tenant": "t",
        "group_id": "g",
        "step": 0,
        "prompt_ids": [1],
        "response_ids": [2],
        "loss_mask": [1],
        "reward": 1.0,
        "return": 1.0,
        "advantage": 0.5,
        "baseline": 0.5,
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "day": dt.date(2030, 1, 1),
        "created_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
    }
    data = pa.Table.from_pylist([row], schema=TRANSITIONS)
    lake.write("transitions", data, mode="overwrite", predicate="group_id = 'g'")
    assert pl.read_delta(lake.uri("transitions"))["baseline"].to_list() == [0.5]


def _trajectory(rollout: str, sha: str | None, schema: pa.Schema) -> pa.Table:
    t = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    call = {
        "span_id": "s" + rollout,
        "step": 0,
        "agent_name": "solver",
        "start_time": t,
        "end_time": t,
        "llm_response_id": "c" + rollout,
        "llm_model": "m",
        "policy_version": "p@v0001",
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3],
        "completion_logprobs": [-0.5],
        "policy_sha256": sha,
    }
    row = {
        "rollout_id": rollout,
        "tenant": "default",
        "task_id": "task",
        "status": "finished",
        "agents": ["solver"],
        "n_llm_calls": 1,
        "start_time": t,
        "end_time": t,
        "calls": [{k: v for k, v in call.items() if k in schema.field("calls").type.value_type.names}],
        "rewards": [],
        "final_reward": 1.0,
        "policy_versions": ["p@v0001"],
        "updated_at": t,
        "day": t.date(),
    }
    return pa.Table.from_pylist([row], schema=schema)


def test_a_trajectories_table_from_before_call_hashes_builds_and_gains_the_nested_field(tmp_path: Path) -> None:
    """Trajectories v1 (calls without `policy_sha256`): transitions build from it with null hashes, and
    the next write adds the field inside the list of structs (a nested schema merge), old calls null."""
    lake = Lake(str(tmp_path))
    call_v1 = pa.struct([f for f in LLM_CALL if f.name not in ("policy_sha256", "tools")])
    v1 = TRAJECTORIES.set(TRAJECTORIES.get_field_index("calls"), pa.field("calls", pa.list_(call_v1)))
    write_deltalake(lake.uri("trajectories"), _trajectory("r1", None, v1), partition_by=["day"])

    now = dt.datetime(2030, 1, 2, tzinfo=dt.UTC)
    built = build(pl.read_delta(lake.uri("trajectories")), CreditSettings(), now=now).table
    assert built.num_rows == 1 and built["policy_sha256"].to_pylist() == [None]

    new = _trajectory("r2", "ab" * 32, TRAJECTORIES)
    lake.write("trajectories", new, mode="overwrite", predicate="rollout_id = 'r2'")
    got = pl.read_delta(lake.uri("trajectories")).sort("rollout_id")
    assert [c[0]["policy_sha256"] for c in got["calls"].to_list()] == [None, "ab" * 32]
    built = build(got, CreditSettings(), now=now).table.sort_by("rollout_id")
    assert built["policy_sha256"].to_pylist() == [None, "ab" * 32]


def test_a_transitions_table_from_before_v5_gains_token_status(tmp_path: Path) -> None:
    """v5's `token_status` goes last: a v4 table takes the new rows, its old rows read as null."""
    lake = Lake(str(tmp_path))
    v4 = TRANSITIONS.remove(TRANSITIONS.get_field_index("token_status"))
    row = dict.fromkeys(TRANSITIONS.names)
    row |= {
        "transition_id": "r/a/0",
        "rollout_id": "r",
        "tenant": "t",
        "group_id": "g",
        "step": 0,
        "prompt_ids": [1],
        "response_ids": [2],
        "loss_mask": [1],
        "reward": 1.0,
        "return": 1.0,
        "advantage": 0.5,
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "day": dt.date(2030, 1, 1),
        "created_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
    }
    old = {k: v for k, v in row.items() if k != "token_status"}
    write_deltalake(lake.uri("transitions"), pa.Table.from_pylist([old], schema=v4), partition_by=["day"])
    new = row | {"transition_id": "r/a/1", "step": 1, "group_id": "h", "token_status": "verified"}
    lake.write(
        "transitions", pa.Table.from_pylist([new], schema=TRANSITIONS), mode="overwrite", predicate="group_id = 'h'"
    )
    got = pl.read_delta(lake.uri("transitions")).sort("step")
    assert got["token_status"].to_list() == [None, "verified"]
