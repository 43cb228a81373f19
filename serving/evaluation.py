"""Paired evaluation: whether a version scores better than another beyond the noise of the task sample.

Two means over a few dozen sampled tasks differ by several points by chance alone, so a bare
"after > before" reads noise as learning (issue 26). Here both versions are scored on the SAME tasks
(with the same sampling seeds), each task's score is the mean over its samples, and the 95% interval
of the mean difference comes from a percentile bootstrap over TASKS: tasks are the unit that was
sampled, samples within a task are not independent draws of the population.

Pure (numpy only): the demo (examples/closed_loop), the eval gate (serving.eval_gate) and the canary
(serving.canary) all decide with ``compare`` and ``verdict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Verdict = Literal["gain beyond noise", "loss beyond noise", "within noise"]
GAIN: Verdict = "gain beyond noise"
LOSS: Verdict = "loss beyond noise"
NOISE: Verdict = "within noise"

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 4000  # the 2.5% tail then rests on ~100 resamples: its percentile moves < 0.01 between seeds


@dataclass(frozen=True)
class Interval:
    """A mean and its bootstrap interval over tasks."""

    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class Paired:
    """Two versions scored on the same tasks: each one's mean and interval, the difference and its verdict."""

    n_tasks: int
    before: Interval
    after: Interval
    diff: Interval  # after - before, paired by task
    confidence: float
    verdict: Verdict


def task_scores(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each task's score: the mean over its samples (a task with no sample is an error, not a zero)."""
    empty = [task for task, values in samples.items() if len(values) == 0]
    if empty:
        raise ValueError(f"tasks without a sample: {', '.join(map(str, empty[:5]))}")
    return {task: float(np.mean(values)) for task, values in samples.items()}


def resample_indices(n: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """``resamples`` x ``n`` task indices drawn with replacement, from a seeded generator (reproducible)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def percentile_interval(values: Sequence[float], indices: np.ndarray, confidence: float) -> Interval:
    """The mean of ``values`` and the percentile interval of its mean over the resamples ``indices``.

    ``confidence`` 0 collapses the interval onto the mean itself (a bare comparison)."""
    if not 0.0 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0, 1), not {confidence}")
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no task to take a mean over")
    mean = float(data.mean())
    if confidence == 0.0:
        return Interval(mean, mean, mean)
    means = data[indices].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(mean, float(low), float(high))


def verdict(diff: Interval) -> Verdict:
    """Gain or loss only when the whole interval of the difference lies on one side of zero."""
    if diff.low > 0.0:
        return GAIN
    if diff.high < 0.0:
        return LOSS
    return NOISE


def interval(
    scores: Sequence[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """One version's mean over per-task scores and its bootstrap interval over tasks."""
    return percentile_interval(scores, resample_indices(len(scores), resamples=resamples, seed=seed), confidence)


def compare(
    before: Mapping[str, float],
    after: Mapping[str, float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Paired:
    """Paired comparison of per-task scores (task -> score) of two versions on the same tasks.

    Every resample draws one set of tasks and takes both versions' and the difference's means over it,
    so the three intervals come from the same resamples."""
    if set(before) != set(after):
        missing = sorted(set(before) ^ set(after))
        raise ValueError(f"a paired comparison needs the same tasks on both sides; unmatched: {missing[:5]}")
    tasks = sorted(before)
    b = [before[t] for t in tasks]
    a = [after[t] for t in tasks]
    indices = resample_indices(len(tasks), resamples=resamples, seed=seed)
    diff = percentile_interval([y - x for x, y in zip(b, a, strict=True)], indices, confidence)
    return Paired(
        n_tasks=len(tasks),
        before=percentile_interval(b, indices, confidence),
        after=percentile_interval(a, indices, confidence),
        diff=diff,
        confidence=confidence,
        verdict=verdict(diff),
    )


def sample_seed(seed: int, task_index: int, sample: int) -> int:
    """The sampling seed of sample ``sample`` of task ``task_index``: the same before and after, so the two
    versions are compared on the same random draws too (vLLM's per-request ``seed``)."""
    return (seed * 1_000_003 + task_index * 1_009 + sample) % 2**31
