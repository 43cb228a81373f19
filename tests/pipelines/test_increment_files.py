"""An increment rewrites only what it changes: rollouts (and groups) the lake has not seen are appended,
a changed one is replaced from its own day on, and the files of older days are left alone (issue 28: cost
follows the increment). Two runs at once cannot both add the same new rollouts: tests/pipelines/test_step_chain.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl

from pipelines.gold.transitions_step import update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import CreditSettings, KafkaSettings
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout
from tests.pipelines.test_days import DAY_NS, T0, ingest_direct


def _last_write(lake: Lake, table: str) -> dict[str, object]:
    dt_ = lake.table(table)
    assert dt_ is not None
    return dict(dt_.history(1)[0].get("operationParameters") or {})


def _files(lake: Lake, table: str) -> set[str]:
    dt_ = lake.table(table)
    assert dt_ is not None
    return set(dt_.file_uris())


def test_new_and_changed_rollouts_are_written_from_their_own_day(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")
    lake = Lake(str(tmp_path / "lake"))
    credit = CreditSettings()
    now = dt.datetime.fromtimestamp((T0 + 30 * DAY_NS) / 1e9, dt.UTC)
    old = Rollout(
        "old", task_id="t-old", calls=[Call(prompt=[1], response=[2])], t0_ns=T0 - 20 * DAY_NS, final_reward=1.0
    )
    ingest_direct(lake, "s", [old], 0)
    update_trajectories(lake, kafka, idle_timeout_s=1e9, now=now)
    update_transitions(lake, credit, now=now)
    old_traj, old_trans = _files(lake, "trajectories"), _files(lake, "transitions")

    # rollouts the lake has never seen, of tasks it has not seen: appended, nothing read or rewritten
    x = Rollout("x", task_id="t-x", calls=[Call(prompt=[1], response=[2], response_id="a")], t0_ns=T0, end_root=False)
    y = Rollout("y", task_id="t-y", calls=[Call(prompt=[3], response=[4])], t0_ns=T0, final_reward=1.0)
    ingest_direct(lake, "s", [x, y], 1)
    update_trajectories(lake, kafka, idle_timeout_s=1e9, now=now)
    for table in ("trajectories", "transitions"):
        if table == "transitions":
            update_transitions(lake, credit, now=now)
        params = _last_write(lake, table)
        assert params.get("mode") == "Append" and "predicate" not in params
    assert old_traj <= _files(lake, "trajectories")
    assert old_trans <= _files(lake, "transitions")

    # more of "x", and another rollout of y's task: their rows are replaced (trajectories: x's; transitions:
    # the group t-y's), from their day on only; the old day's files stay as they were
    later = Rollout(
        "x", task_id="t-x", calls=[Call(prompt=[5], response=[6], response_id="b")], t0_ns=T0 + DAY_NS, final_reward=1.0
    )
    y2 = Rollout("y2", task_id="t-y", calls=[Call(prompt=[7], response=[8])], t0_ns=T0 + DAY_NS, final_reward=0.0)
    ingest_direct(lake, "s", [later, y2], 3)
    update_trajectories(lake, kafka, idle_timeout_s=1e9, now=now)
    x_day = dt.datetime.fromtimestamp(T0 / 1e9, dt.UTC).date().isoformat()
    params = _last_write(lake, "trajectories")
    assert params.get("mode") == "Overwrite"
    assert str(params.get("predicate", "")).startswith(f"day >= '{x_day}'")
    update_transitions(lake, credit, now=now)
    params = _last_write(lake, "transitions")
    assert params.get("mode") == "Overwrite"
    assert str(params.get("predicate", "")).startswith(f"day >= '{x_day}'")
    assert old_traj <= _files(lake, "trajectories")
    assert old_trans <= _files(lake, "transitions")

    traj = pl.read_delta(lake.uri("trajectories")).sort("rollout_id")
    assert traj["rollout_id"].to_list() == ["old", "x", "y", "y2"]
    assert traj.filter(pl.col("rollout_id") == "x")["n_llm_calls"].item() == 2
    trans = pl.read_delta(lake.uri("transitions"))
    assert trans.group_by("rollout_id").len().sort("rollout_id").rows() == [("old", 1), ("x", 2), ("y", 1), ("y2", 1)]
