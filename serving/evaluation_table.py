"""The `evaluations` table: every evaluation of a version, so the registry can show how each one did.

The demo's before/after and every eval gate and canary decision append one row per version scored
(``record``); ``latest`` reads back each version's newest row for ``agentlake model list``/``show``.
Writing is best effort for the gate: a lake hiccup must not turn a decided publish into a failure.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from schemas.lake import Lake
from schemas.tables import EVALUATIONS
from serving.evaluation import Interval, Paired

log = logging.getLogger(__name__)
TABLE = "evaluations"


@dataclass(frozen=True)
class Scored:
    """One version's side of an evaluation: what to store for it."""

    version: str
    score: Interval
    baseline_version: str | None = None
    baseline_mean: float | None = None
    diff: Interval | None = None
    verdict: str | None = None


def paired_rows(
    paired: Paired,
    *,
    before_version: str,
    after_version: str,
    compare_before: bool = False,
) -> list[Scored]:
    """The rows of a paired comparison: the after version against the before one, and (``compare_before``) the
    before version's own score without a baseline (the demo stores both ends; a gate stores the candidate)."""
    after = Scored(
        after_version,
        paired.after,
        baseline_version=before_version,
        baseline_mean=paired.before.mean,
        diff=paired.diff,
        verdict=paired.verdict,
    )
    return [Scored(before_version, paired.before), after] if compare_before else [after]


def record(
    lake: Lake,
    scored: Sequence[Scored],
    *,
    task_set: str,
    n_tasks: int,
    n_samples: int,
    confidence: float,
    source: str,
    agent: str | None = None,
    at: dt.datetime | None = None,
) -> int:
    """Append one row per scored version in one commit; the table's new Delta version."""
    when = at or dt.datetime.now(dt.UTC)
    rows = [
        {
            "version": s.version,
            "agent": agent,
            "task_set": task_set,
            "n_tasks": n_tasks,
            "n_samples": n_samples,
            "mean": s.score.mean,
            "ci_low": s.score.low,
            "ci_high": s.score.high,
            "confidence": confidence,
            "baseline_version": s.baseline_version,
            "baseline_mean": s.baseline_mean,
            "diff": None if s.diff is None else s.diff.mean,
            "diff_ci_low": None if s.diff is None else s.diff.low,
            "diff_ci_high": None if s.diff is None else s.diff.high,
            "verdict": s.verdict,
            "source": source,
            "evaluated_at": when,
        }
        for s in scored
    ]
    return lake.write(TABLE, pa.Table.from_pylist(rows, schema=EVALUATIONS))


def try_record(lake: Lake, scored: Sequence[Scored], **kwargs: Any) -> None:
    """``record``, with a failure logged instead of raised (the gate's decision stands without its row)."""
    try:
        record(lake, scored, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the lake is not part of the decision
        log.warning("could not record the evaluation of %s in %s: %s", [s.version for s in scored], TABLE, exc)


def latest(lake: Lake) -> dict[str, dict[str, Any]]:
    """Each version's newest evaluation row (version -> row); empty when nothing was evaluated yet."""
    scan = lake.scan(TABLE)
    if scan is None:
        return {}
    newest: dict[str, dict[str, Any]] = {}
    for row in scan.collect().sort("evaluated_at").to_dicts():
        newest[str(row["version"])] = row
    return newest


def describe(row: dict[str, Any]) -> str:
    """One evaluation in a line: ``0.412 [0.371, 0.455] on demo-heldout (128 tasks x 4); vs base +0.062 [...]``."""
    text = (
        f"{row['mean']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] on {row['task_set']} "
        f"({row['n_tasks']} tasks x {row['n_samples']})"
    )
    if row.get("diff") is not None:
        text += (
            f"; vs {row['baseline_version']} {row['diff']:+.3f} "
            f"[{row['diff_ci_low']:+.3f}, {row['diff_ci_high']:+.3f}]: {row['verdict']}"
        )
    return text
