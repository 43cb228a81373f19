"""The collapse signals (``pipelines.lake.health``) on frames: the relative thresholds, policy lines, and
properties over generated workloads (a reward shift never fires on two windows of one sample)."""

from __future__ import annotations

import json
import random
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.lake import health
from schemas.config.health import (
    ClipFracCheck,
    EntropyCheck,
    KlCheck,
    RatioCheck,
    RewardHackingCheck,
    RewardShiftCheck,
    ZeroAdvantageCheck,
)


def versions(*metrics: dict[str, Any], agent: str | None = None, start: int = 1) -> list[dict[str, Any]]:
    return [
        {"version": f"v{start + i:04d}", "version_number": start + i, "agent": agent, "metrics": json.dumps(m)}
        for i, m in enumerate(metrics)
    ]


def test_entropy_that_fell_by_the_factor_fires_above_the_floor() -> None:
    cfg = EntropyCheck(floor=0.05, drop_factor=0.25, reference_versions=2)
    frame = health.version_frame(versions({"final_entropy": 2.0}, {"final_entropy": 2.0}, {"final_entropy": 0.4}))
    fired = health.entropy_collapse(frame, cfg)
    assert fired.fired and "fell below 0.25 x the first versions' 2" in fired.description
    steady = health.version_frame(versions({"final_entropy": 2.0}, {"final_entropy": 2.0}, {"final_entropy": 0.6}))
    assert not health.entropy_collapse(steady, cfg).fired
    # with no more versions than the reference, only the floor applies
    assert not health.entropy_collapse(steady.head(2), cfg).fired


def test_entropy_is_read_from_the_tracker_key_when_the_summary_has_none() -> None:
    frame = health.version_frame(versions({"entropy_mean": 0.01}))
    assert health.entropy_collapse(frame, EntropyCheck()).fired


def test_a_clip_fraction_spike_over_the_previous_median_fires() -> None:
    cfg = ClipFracCheck(max_clip_frac=0.5, spike_factor=3.0, window=3)
    base = [{"final_clip_frac": f} for f in (0.02, 0.05, 0.04, 0.05)]
    assert health.clip_frac_spike(health.version_frame(versions(*base, {"final_clip_frac": 0.2})), cfg).fired
    assert not health.clip_frac_spike(health.version_frame(versions(*base, {"final_clip_frac": 0.12})), cfg).fired
    # the only version: the ceiling alone
    assert not health.clip_frac_spike(health.version_frame(versions({"final_clip_frac": 0.3})), cfg).fired


def test_each_policy_line_is_judged_on_its_own_versions() -> None:
    """The planner's line collapsed; the coder's did not (and its high first entropy is no reference for
    the planner's)."""
    rows = versions({"final_entropy": 3.0}, {"final_entropy": 3.0}, {"final_entropy": 2.9}, agent="coder")
    rows += versions({"final_entropy": 0.3}, {"final_entropy": 0.3}, {"final_entropy": 0.2}, agent="planner", start=4)
    cfg = EntropyCheck(floor=0.05, drop_factor=0.25)
    finding = health.per_line(health.version_frame(rows), lambda v: health.entropy_collapse(v, cfg))
    assert not finding.fired
    rows[-1]["metrics"] = json.dumps({"final_entropy": 0.04})
    finding = health.per_line(health.version_frame(rows), lambda v: health.entropy_collapse(v, cfg))
    assert finding.fired and finding.description.startswith("planner: v0006's entropy 0.04")
    assert finding.values["planner/entropy"] == 0.04 and finding.values["coder/entropy"] == 2.9


def test_metrics_a_round_records_as_constants_are_not_read_as_measurements() -> None:
    """kl_coef 0: the recorded KL is 0 because no reference model ran; REINFORCE: ratio 1, clip fraction 0."""
    metrics = {"final_kl": 0.0, "final_ratio": 1.0, "final_clip_frac": 0.0}
    rows = versions(metrics)
    rows[0]["config"] = json.dumps({"kl_coef": 0.0, "algorithm": "grpo"})
    frame = health.version_frame(rows)
    assert health.kl_blowup(frame, KlCheck()).skipped and not health.ratio_blowup(frame, RatioCheck()).skipped
    rows[0]["config"] = json.dumps({"kl_coef": 0.1, "algorithm": "reinforce"})
    frame = health.version_frame(rows)
    assert health.ratio_blowup(frame, RatioCheck()).skipped and health.clip_frac_spike(frame, ClipFracCheck()).skipped
    rows[0]["config"] = json.dumps({"kl_coef": 0.1, "algorithm": "ppo"})
    assert not health.kl_blowup(health.version_frame(rows), KlCheck()).skipped


def _transitions(rewards: list[float], advantages: list[float], version: str = "p@v0001") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "tenant": ["default"] * len(rewards),
            "rollout_id": [f"r{i:05d}" for i in range(len(rewards))],
            "agent_name": ["solver"] * len(rewards),
            "policy_version": [version] * len(rewards),
            "reward": rewards,
            "advantage": advantages,
            "created_at": list(range(len(rewards))),
        }
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5]), min_size=4, max_size=40), st.randoms())
def test_a_reward_shift_never_fires_on_two_windows_of_one_sample(rewards: list[float], rnd: random.Random) -> None:
    """The recent window is the reference one reshuffled: the same distribution, KS 0."""
    again = list(rewards)
    rnd.shuffle(again)
    cfg = RewardShiftCheck(window=len(rewards), min_rollouts=min(len(rewards), 4), max_ks=0.01)
    frame = _transitions(rewards + again, [0.0] * (2 * len(rewards)))
    finding = health.reward_shift(health.rollout_rewards(frame), cfg)
    assert not finding.fired and not finding.skipped and finding.values["ks"] == 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30),
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30),
)
def test_the_ks_statistic_is_a_symmetric_distance_in_0_1(a: list[float], b: list[float]) -> None:
    d = health.ks_statistic(a, b)
    assert 0.0 <= d <= 1.0 and d == pytest.approx(health.ks_statistic(b, a))
    assert health.ks_statistic(a, a) == 0.0
    assert health.ks_statistic([x - 20 for x in a], [x + 20 for x in b]) == 1.0  # disjoint: the CDFs part wholly


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(1, 40), st.floats(0.05, 1.0))
def test_zero_advantage_fires_exactly_when_the_share_reaches_the_limit(zero: int, other: int, limit: float) -> None:
    frame = _transitions([1.0] * (zero + other), [0.0] * zero + [0.5] * other)
    finding = health.zero_advantage(frame, ZeroAdvantageCheck(max_fraction=limit, min_rows=1))
    assert finding.fired == (zero / (zero + other) >= limit)


def test_zero_advantage_reads_the_newest_policy_versions_rows_only() -> None:
    old = _transitions([1.0] * 10, [0.0] * 10, version="p@v0001")
    new = _transitions([1.0, 0.0] * 5, [0.5, -0.5] * 5, version="p@v0002").with_columns(pl.col("created_at") + 100)
    finding = health.zero_advantage(pl.concat([old, new]), ZeroAdvantageCheck(min_rows=4))
    assert not finding.fired and finding.values["policy_version"] == "p@v0002" and finding.values["rows"] == 10


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=3, max_size=6),
    st.lists(st.floats(0, 1, allow_nan=False), min_size=6, max_size=6),
)
def test_reward_hacking_never_fires_while_held_out_does_not_fall(train: list[float], held: list[float]) -> None:
    held = sorted(held)[: len(train)]  # non-decreasing held-out
    rows = versions(*({} for _ in held))
    frame = health.version_frame(rows, {r["version"]: h for r, h in zip(rows, held, strict=True)})
    rewards = pl.DataFrame(
        {"version": [r["version"] for r in rows], "train_reward": train, "rollouts": [8] * len(rows)}
    )
    finding = health.reward_hacking(frame, rewards, RewardHackingCheck(versions=3, min_train_rise=0, min_eval_drop=0))
    assert not finding.fired and not finding.skipped


def test_the_reward_shift_is_per_agent() -> None:
    """The planner's rewards jumped from 0 to 1; the coder's, mixed before and after, did not move: the
    pooled rewards would blur the planner's shift, per agent it shows, and names the agent."""
    steady = _transitions([0.0, 1.0] * 8, [0.5] * 16).with_columns(agent_name=pl.lit("coder"))
    jumped = _transitions([0.0] * 8 + [1.0] * 8, [0.5] * 16).with_columns(
        agent_name=pl.lit("planner"), rollout_id=pl.col("rollout_id") + "p"
    )
    cfg = RewardShiftCheck(window=8, min_rollouts=4, max_ks=0.5)
    finding = health.reward_shift(health.rollout_rewards(pl.concat([steady, jumped])), cfg)
    assert finding.fired and finding.description.startswith("planner: mean reward 0 -> 1")
    assert finding.values["planner/ks"] == 1.0 and finding.values["coder/ks"] == 0.0
    assert not health.reward_shift(health.rollout_rewards(steady), cfg).fired
