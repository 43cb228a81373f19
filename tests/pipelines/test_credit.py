"""Credit assignment and advantages on hand-checked cases (pure, no Kafka)."""

from __future__ import annotations

import math

import polars as pl
import pytest

from pipelines.gold.baselines import RunningBaseline
from pipelines.gold.credit import advantages, assign_credit, match_first_occurrence


def calls(rollouts: list[tuple[str, str, float, list[float | None]]]) -> pl.DataFrame:
    """(rollout key, group, final reward, per-step rewards) to one row per call."""
    rows = []
    for order, (rk, group, final, step_rewards) in enumerate(rollouts):
        for i, r in enumerate(step_rewards):
            rows.append(
                {
                    "_attempt": rk,
                    "group_id": group,
                    "final_reward": final,
                    "step": i,
                    "n_steps": len(step_rewards),
                    "step_reward": r,
                    "_final_matched": False,
                    "_order": order,
                }
            )
    return pl.DataFrame(rows)


TWO = [("a", "g", 1.0, [0.2, None, None]), ("b", "g", 0.0, [None, None, None])]
SD = math.sqrt(0.5)  # sample std of {1, 0}


def col(df: pl.DataFrame, rk: str, name: str) -> list[float]:
    return df.filter(pl.col("_attempt") == rk).sort("step")[name].to_list()


def approx(xs: list[float]) -> object:
    return pytest.approx(xs, abs=1e-4)


def test_identical_grpo_is_lightningrl() -> None:
    df = advantages(assign_credit(calls(TWO), "identical", 1.0), "grpo")
    assert col(df, "a", "reward") == [1.0, 1.0, 1.0]
    assert col(df, "a", "return") == [1.0, 1.0, 1.0]
    assert col(df, "a", "advantage") == approx([0.5 / SD] * 3)
    assert col(df, "b", "advantage") == approx([-0.5 / SD] * 3)


def test_last_only() -> None:
    df = advantages(assign_credit(calls(TWO), "last_only", 1.0), "grpo")
    assert col(df, "a", "reward") == [0.0, 0.0, 1.0]
    assert col(df, "a", "return") == [0.0, 0.0, 1.0]
    assert col(df, "a", "advantage") == approx([0.0, 0.0, 0.5 / SD])


def test_discounted() -> None:
    df = advantages(assign_credit(calls(TWO), "discounted", 0.5), "grpo")
    assert col(df, "a", "reward") == [0.0, 0.0, 1.0]
    assert col(df, "a", "return") == approx([0.25, 0.5, 1.0])
    assert col(df, "a", "advantage") == approx([0.25 * 0.5 / SD, 0.5 * 0.5 / SD, 0.5 / SD])


def test_per_step() -> None:
    df = advantages(assign_credit(calls(TWO), "per_step", 0.5), "grpo", per_step=True)
    # a: rewards [.2, 0, 1] (final not matched to a call: it lands on the last one)
    assert col(df, "a", "reward") == approx([0.2, 0.0, 1.0])
    assert col(df, "a", "return") == approx([0.45, 0.5, 1.0])
    b, s = 0.225, math.sqrt(((0.45 - 0.225) ** 2 + 0.225**2) / 1)
    assert col(df, "a", "advantage") == approx([(0.45 - b) / s, (0.5 - b) / s, (1.0 - b) / s])
    assert col(df, "b", "advantage") == approx([-b / s] * 3)


def test_grpo_without_std_and_single_sample_groups() -> None:
    df = advantages(assign_credit(calls(TWO), "identical", 1.0), "grpo", normalize_std=False)
    assert col(df, "a", "advantage") == approx([0.5] * 3)
    alone = advantages(assign_credit(calls([("x", "solo", 1.0, [None])]), "identical", 1.0), "grpo")
    assert col(alone, "x", "advantage") == [0.0]


def test_rloo() -> None:
    three = [("a", "g", 1.0, [None]), ("b", "g", 0.0, [None]), ("c", "g", 0.5, [None])]
    df = advantages(assign_credit(calls(three), "identical", 1.0), "rloo")
    assert [col(df, k, "advantage")[0] for k in "abc"] == approx([0.75, -0.75, 0.0])


def test_running_baseline_carries_state() -> None:
    seq = [("a", "a", 1.0, [None]), ("b", "b", 0.0, [None]), ("c", "c", 1.0, [None])]
    state = RunningBaseline()
    df = advantages(assign_credit(calls(seq), "identical", 1.0), "running_baseline", baseline=state)
    assert [col(df, k, "advantage")[0] for k in "abc"] == approx([1.0, -1.0, 0.5])
    again = RunningBaseline.from_json(state.to_json())
    assert (again.value, again.count) == (state.value, 3)


def test_first_occurrence_matching() -> None:
    # calls end at 10, 20, 30; rewards at 15, 35, 36
    assert match_first_occurrence([10, 20, 30], [15, 35, 36]) == [0, 2, 1]
    # a reward before any call ended matches nothing
    assert match_first_occurrence([10], [5]) == [None]
