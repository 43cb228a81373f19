"""The paired evaluation's statistics: a case small enough to enumerate every resample, and properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.evaluation import (
    GAIN,
    LOSS,
    NOISE,
    Interval,
    compare,
    interval,
    percentile_interval,
    sample_seed,
    task_scores,
    verdict,
)


def all_resamples(n: int) -> np.ndarray:
    """Every one of the n**n ways to draw n tasks with replacement: the exact bootstrap distribution."""
    return np.array(list(itertools.product(range(n), repeat=n)))


def test_three_tasks_by_hand() -> None:
    # Per-task diffs 0, 1, 0. Of the 27 resamples, k draws of task b give a mean of k/3, with counts
    # C(3,k) 2^(3-k): 8 at 0, 12 at 1/3, 6 at 2/3, 1 at 1. Linear percentiles over the 27 sorted means:
    # 2.5% sits at position 0.65 (between two zeros): 0; 97.5% at 25.35: 2/3 + 0.35 * (1 - 2/3) = 0.78333...
    exact = percentile_interval([0.0, 1.0, 0.0], all_resamples(3), 0.95)
    assert exact == Interval(pytest.approx(1 / 3), 0.0, pytest.approx(2 / 3 + 0.35 / 3))
    assert verdict(exact) == NOISE  # the interval touches zero: one gain in three tasks is not beyond noise


def test_task_scores_average_samples_and_pairing_uses_them() -> None:
    before = task_scores({"a": [1, 1], "b": [0, 0], "c": [1, 0]})
    after = task_scores({"a": [1, 1], "b": [1, 1], "c": [1, 0]})
    assert before == {"a": 1.0, "b": 0.0, "c": 0.5}
    paired = compare(before, after, resamples=20_000, seed=3)
    assert paired.n_tasks == 3
    assert paired.diff.mean == pytest.approx(1 / 3)
    # The bootstrap distribution puts 8/27 on a mean diff of 0 and 1/27 (3.7%, above the 2.5% tail) on 1, so
    # many seeded draws find exactly those percentiles (27 enumerated points interpolate between 2/3 and 1).
    assert (paired.diff.low, paired.diff.high) == (0.0, 1.0)
    assert paired.before.mean == pytest.approx(0.5) and paired.after.mean == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="without a sample"):
        task_scores({"a": []})


def test_seeded_resampling_matches_exact_enumeration_on_five_tasks() -> None:
    diffs = [0.0, 1.0, 0.5, -0.5, 1.0]
    exact = percentile_interval(diffs, all_resamples(5), 0.95)  # 3125 resamples, every one
    drawn = interval(diffs, resamples=50_000, seed=7)
    assert drawn.mean == exact.mean
    assert drawn.low == pytest.approx(exact.low, abs=0.03)
    assert drawn.high == pytest.approx(exact.high, abs=0.03)


def test_verdicts() -> None:
    same = {f"t{i}": 0.5 for i in range(40)}
    better = {f"t{i}": 1.0 for i in range(40)}
    assert compare(same, better).verdict == GAIN
    assert compare(better, same).verdict == LOSS
    assert compare(same, same).verdict == NOISE
    # one task of forty flips: a bare comparison calls it a loss, the bootstrap does not
    one_off = {**better, "t0": 0.0}
    assert compare(better, one_off).verdict == NOISE
    assert compare(better, one_off, confidence=0.0).verdict == LOSS
    with pytest.raises(ValueError, match="same tasks"):
        compare({"a": 1.0}, {"b": 1.0})
    with pytest.raises(ValueError, match="confidence"):
        compare(same, same, confidence=1.0)


def test_sample_seeds_differ_per_task_and_sample_and_repeat_per_run() -> None:
    seeds = {sample_seed(0, i, j) for i in range(128) for j in range(8)}
    assert len(seeds) == 128 * 8
    assert sample_seed(1, 5, 2) == sample_seed(1, 5, 2) != sample_seed(2, 5, 2)


scores = st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=40)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[dict[str, float], dict[str, float]]:
    before = draw(scores)
    after = draw(st.lists(st.floats(0, 1, allow_nan=False), min_size=len(before), max_size=len(before)))
    return dict(zip(map(str, range(len(before))), before, strict=True)), dict(
        zip(map(str, range(len(after))), after, strict=True)
    )


@settings(max_examples=60, deadline=None)
@given(pairs(), st.integers(0, 2**16))
def test_the_interval_holds_the_mean_diff_and_lies_within_the_task_diffs(
    pair: tuple[dict[str, float], dict[str, float]], seed: int
) -> None:
    before, after = pair
    p = compare(before, after, resamples=500, seed=seed)
    diffs = [after[t] - before[t] for t in before]
    eps = 1e-9
    assert min(diffs) - eps <= p.diff.low <= p.diff.mean + eps
    assert p.diff.mean - eps <= p.diff.high <= max(diffs) + eps
    assert p.diff.mean == pytest.approx(p.after.mean - p.before.mean, abs=1e-12)
    assert p.verdict == verdict(p.diff)
    assert compare(before, after, resamples=500, seed=seed) == p  # seeded: the same answer every time


@settings(max_examples=60, deadline=None)
@given(pairs(), st.floats(-1, 1, allow_nan=False), st.integers(0, 2**16))
def test_shifting_after_shifts_the_interval_and_swapping_mirrors_it(
    pair: tuple[dict[str, float], dict[str, float]], c: float, seed: int
) -> None:
    before, after = pair
    p = compare(before, after, resamples=500, seed=seed)
    shifted = compare(before, {t: v + c for t, v in after.items()}, resamples=500, seed=seed)
    assert shifted.diff.low == pytest.approx(p.diff.low + c, abs=1e-9)
    assert shifted.diff.high == pytest.approx(p.diff.high + c, abs=1e-9)
    swapped = compare(after, before, resamples=500, seed=seed)
    assert swapped.diff.low == pytest.approx(-p.diff.high, abs=1e-9)
    assert swapped.diff.high == pytest.approx(-p.diff.low, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(scores, st.integers(0, 2**16))
def test_a_wider_confidence_gives_a_wider_interval(values: list[float], seed: int) -> None:
    narrow = interval(values, confidence=0.5, resamples=500, seed=seed)
    wide = interval(values, confidence=0.95, resamples=500, seed=seed)
    assert wide.low <= narrow.low + 1e-12 and narrow.high <= wide.high + 1e-12
