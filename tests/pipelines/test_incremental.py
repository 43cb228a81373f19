"""Incremental steps that interleave or rerun give what one run gives (findings 4 and 6 of issue 14)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.gold.transitions_step import saved_baseline, update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import CreditSettings
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from tests.pipelines.test_identity import KAFKA, NOW


def rollout(i: int, task: str, reward: float) -> KafkaRecord:
    call = Call(prompt=[1, i], response=[2, i], logprobs=[-0.5, -0.25])
    r = Rollout(f"r{i}", task_id=task, calls=[call], final_reward=reward, t0_ns=(1_750_000_000 + i) * 10**9)
    return KafkaRecord("s", 0, i, None, encode(make_spans(r)), [])


def deliver(lake: Lake, recs: list[KafkaRecord]) -> None:
    lake.write("spans", decode_spans(recs)[0], txns={"kafka:s:0": recs[-1].offset})


def test_the_running_baseline_advances_once_per_rollout_however_often_its_group_is_recomputed(
    tmp_path: Path,
) -> None:
    credit = CreditSettings(advantage="running_baseline")
    rewards = [1.0, 0.0, 1.0, 0.5]
    lake = Lake(str(tmp_path / "lake"))
    for i, reward in enumerate(rewards):  # one task: every delivery recomputes the whole group
        deliver(lake, [rollout(i, "task", reward)])
        update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW)
        update_transitions(lake, credit, now=NOW)
    saved = json.loads(saved_baseline(lake) or "{}")
    assert saved["agents"]["default"]["solver"]["count"] == len(rewards)
    incremental = pl.read_delta(lake.uri("transitions")).sort("rollout_id")
    # each rollout was compared with the baseline of the rollouts before it, as it arrived
    assert incremental["baseline"].to_list() == [0.0, 1.0, 0.5, 2 / 3]
    assert incremental["advantage"].to_list() == [1.0, -1.0, 0.5, 0.5 - 2 / 3]


class InterleavingLake(Lake):
    """A lake that runs ``after_first`` once, right after the first `trajectories` commit lands.

    Not a mock: the two real steps interleave on a real table the way a CLI or replay run
    can overlap an automatic one; only the moment is chosen by the test.
    """

    after_first: list[Callable[[], Any]]

    def write(self, name: str, data: Any, **kw: Any) -> int:
        version = super().write(name, data, **kw)
        if name == "trajectories" and self.after_first:
            self.after_first.pop()()
        return version


def test_a_transitions_run_between_two_trajectory_chunks_misses_nothing(tmp_path: Path) -> None:
    lake = InterleavingLake(str(tmp_path / "lake"))
    object.__setattr__(lake, "after_first", [])
    deliver(lake, [rollout(0, "a", 1.0), rollout(1, "b", 0.0), rollout(2, "c", 1.0)])
    lake.after_first.append(lambda: update_transitions(lake, CreditSettings(), now=NOW))
    update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW, chunk_rollouts=1)  # three commits
    between = pl.read_delta(lake.uri("transitions"))
    assert between["rollout_id"].to_list() == ["r0"]  # it did run in between
    update_transitions(lake, CreditSettings(), now=NOW)
    assert sorted(pl.read_delta(lake.uri("transitions"))["rollout_id"].to_list()) == ["r0", "r1", "r2"]
