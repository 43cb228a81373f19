"""What the incremental steps share: their result, chunking and key helpers.

Each step (`pipelines.silver.trajectories_step`, `pipelines.gold.transitions_step`) reads "what is
new" from its source tables using watermarks it stored itself (as Delta app transactions in its own
table), recomputes only the affected rollouts or groups, and replaces their rows in one commit
together with the new watermarks. Rerunning a step after a crash redoes the same replacement:
idempotent, never duplicated. Replay and tests call the steps too; the Dagster assets are shells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import polars as pl

from pipelines import keys

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
