"""Two runs of a step at once, planned on one snapshot: the second to commit is refused and nothing lands twice.

The steps append rollouts (and groups) the lake has not seen rather than replacing them (issue 28: a
replacement reads the ids of every file of its days), so what stops two runs from both adding them is the
step's commit chain (``STEP_MARK``): every commit sets it one past the value the run read and expects that
value still there. Here the other run goes in full just before one of the first run's commits (a real
interleaving of two real runs on a real Delta table, no fault injected): that commit and every later one of
the first run must be refused, and the lake must equal one run's on a fresh lake.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.gold.transitions_step import update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import CreditSettings, KafkaSettings
from schemas.errors import ConcurrentWriteError
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout
from tests.pipelines.test_days import T0, ingest_direct

KAFKA = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")
NOW = dt.datetime.fromtimestamp(T0 / 1e9 + 3600, dt.UTC)
CREDIT = CreditSettings()


class _Interleaved(Lake):
    """The lake as one run sees it: just before its ``at``-th commit to ``table``, ``other`` runs in full."""

    def arm(self, table: str, at: int, other: Callable[[], object]) -> None:
        object.__setattr__(self, "_plan", [table, at, other])

    def write(self, name: str, *args: Any, **kwargs: Any) -> int:
        plan = getattr(self, "_plan", None)
        if plan is not None and name == plan[0]:
            if plan[1] == 0:
                object.__setattr__(self, "_plan", None)
                plan[2]()
            plan[1] -= 1
        return super().write(name, *args, **kwargs)


def _rollouts(ids: list[int], task_of: Callable[[int], str]) -> list[Rollout]:
    return [
        Rollout(f"r{i}", task_id=task_of(i), calls=[Call(prompt=[i, 1], response=[i, 2])], t0_ns=T0, final_reward=1.0)
        for i in ids
    ]


def _rows(lake: Lake, table: str) -> list[tuple[Any, ...]]:
    keys = ["rollout_id"] if table == "trajectories" else ["rollout_id", "step"]
    cols = [*keys, "n_spans", "status"] if table == "trajectories" else [*keys, "group_id", "reward"]
    return sorted(pl.read_delta(lake.uri(table)).select(cols).rows())


def _both(lake: Lake, chunk: int) -> None:
    update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW, chunk_rollouts=chunk)
    update_transitions(lake, CREDIT, now=NOW, chunk_rollouts=chunk)


@pytest.mark.parametrize("table", ["trajectories", "transitions"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.integers(0, 3),
    new=st.integers(1, 5),
    chunk=st.integers(1, 3),
    at=st.integers(0, 4),
    shared_tasks=st.booleans(),
)
def test_a_run_planned_on_the_snapshot_another_run_committed_over_is_refused(
    tmp_path_factory: pytest.TempPathFactory,
    table: str,
    before: int,
    new: int,
    chunk: int,
    at: int,
    shared_tasks: bool,
) -> None:
    """``before`` rollouts already in the lake, ``new`` arriving; tasks shared between the two (groups to
    replace) or not (groups to append); chunks of ``chunk``; the other run goes before commit ``at``."""
    root = tmp_path_factory.mktemp("chain")
    task_of = (lambda i: f"t{i % 2}") if shared_tasks else (lambda i: f"t{i}")
    old, arriving = _rollouts(list(range(before)), task_of), _rollouts(list(range(before, before + new)), task_of)
    lakes = {name: _Interleaved(str(root / name)) for name in ("raced", "reference")}
    for lake in lakes.values():
        if old:
            ingest_direct(lake, "s", old, 0)
            _both(lake, chunk)
        ingest_direct(lake, "s", arriving, before)
    raced, reference = lakes["raced"], lakes["reference"]
    _both(reference, chunk)
    other_run = Lake(raced.root)
    step: Callable[[Lake], object]
    if table == "trajectories":

        def step(lake: Lake) -> object:
            return update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW, chunk_rollouts=chunk)
    else:
        update_trajectories(raced, KAFKA, idle_timeout_s=1e9, now=NOW, chunk_rollouts=chunk)

        def step(lake: Lake) -> object:
            return update_transitions(lake, CREDIT, now=NOW, chunk_rollouts=chunk)

    commits_before = raced.version(table)
    raced.arm(table, at, lambda: step(other_run))
    try:
        step(raced)
        refused = False
    except ConcurrentWriteError:
        refused = True
    if getattr(raced, "_plan", None) is None:  # the other run went in before one of this run's commits
        assert refused, "a commit planned on a snapshot another run committed over landed"
    else:  # this run made fewer commits than ``at``: the other run never went, nothing to refuse
        assert not refused and raced.version(table) != commits_before
    update_trajectories(raced, KAFKA, idle_timeout_s=1e9, now=NOW, chunk_rollouts=chunk)
    update_transitions(raced, CREDIT, now=NOW, chunk_rollouts=chunk)
    for name in ("trajectories", "transitions"):
        assert _rows(raced, name) == _rows(reference, name), name


def test_a_run_after_another_finished_commits_on_top(tmp_path: Path) -> None:
    """The chain only refuses a run planned before another committed: runs one after the other all land."""
    lake = Lake(str(tmp_path / "lake"))
    for k in range(3):
        ingest_direct(lake, "s", _rollouts([k], lambda i: f"t{i}"), k)
        _both(lake, 10)
    trans = pl.read_delta(lake.uri("transitions"))
    assert sorted(trans["rollout_id"].unique().to_list()) == ["r0", "r1", "r2"]
    t = lake.table("trajectories")
    assert t is not None and t.transaction_version("trajectories:step") == 3
