"""What the incremental steps share: their result, chunking and key helpers.

Each step (`pipelines.silver.trajectories_step`, `pipelines.gold.transitions_step`) reads "what is
new" from its source tables using watermarks it stored itself (as Delta app transactions in its own
table), recomputes only the affected rollouts or groups, and replaces their rows in one commit
together with the new watermarks. Rerunning a step after a crash redoes the same replacement:
idempotent, never duplicated. Replay and tests call the steps too; the Dagster assets are shells.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import polars as pl

from pipelines import keys
from schemas.lake import OffsetRanges

G = TypeVar("G")


@dataclass
class StepResult:
    """What one step run did; becomes Dagster materialization metadata."""

    rows: int = 0
    rollouts: int = 0
    version: int | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        return {"rows": self.rows, "rollouts": self.rollouts, "delta_version": self.version or 0, **self.extra}


@dataclass
class CommitChain:
    """A step's commit chain: every commit sets the app transaction ``app_id`` to one more than the value the
    run read (``value``) and expects the one before still there, so of two runs planned on one snapshot the
    second to commit is refused before anything lands, whatever rows either writes."""

    app_id: str
    value: int | None

    def link(self) -> dict[str, Any]:
        """``Lake.write``'s ``expect`` and ``marks`` for the next commit; the chain moves on by one."""
        before, self.value = self.value, (self.value or 0) + 1
        return {"expect": {self.app_id: before}, "marks": {self.app_id: self.value}}


def pairs(df: pl.DataFrame, column: str) -> set[keys.Key]:
    """The (tenant, ``column``) pairs of ``df`` where ``column`` is set."""
    return {(t, x) for t, x in df.select("tenant", column).iter_rows() if x}


def group_chunks(groups: list[G], sizes: list[int], limit: int) -> list[list[G]]:
    """Consecutive groups in chunks of at most ``limit`` rows (a bigger group is a chunk of its own)."""
    chunks: list[list[G]] = []
    current: list[G] = []
    total = 0
    for group, size in zip(groups, sizes, strict=True):
        if current and total + size > limit:
            chunks.append(current)
            current, total = [], 0
        current.append(group)
        total += size
    if current:
        chunks.append(current)
    return chunks


def offset_passes(ranges: OffsetRanges, max_records: int, below: Callable[[int], int]) -> list[OffsetRanges]:
    """``ranges`` cut into consecutive passes of about ``max_records`` Kafka records in all, each
    partition's range in equal slices: a step that reads a backlog one pass at a time (one plan, its
    commits and its watermarks) holds one pass in memory, not the backlog. ``below(p)``: an offset
    below partition ``p``'s first, for a range that starts from the beginning (its first pass still
    takes everything up to its end). One pass when ``ranges`` is empty.
    """
    start = {p: lo if lo is not None else below(p) for p, (lo, _) in ranges.items()}
    total = sum(hi - start[p] for p, (_, hi) in ranges.items())
    n = max(1, -(-total // max(max_records, 1)))
    passes: list[OffsetRanges] = []
    for k in range(n):
        part: OffsetRanges = {}
        for p, (lo, hi) in ranges.items():
            a = start[p] + (hi - start[p]) * k // n
            b = start[p] + (hi - start[p]) * (k + 1) // n
            if b > a:
                part[p] = (lo if a == start[p] else a, b)  # a partition's first slice starts where its range does
        passes.append(part)
    return passes
