"""Staleness within a policy line: how many of *its own* versions a row's policy is behind.

Version names are one sequence across the lines (``trainer.lines``), so ``v0005 - v0003`` counts the
other lines' versions in between too, and ``max_staleness`` would skip a planner row that is one
planner version old because the solver published two meanwhile. Here each line's versions are
numbered by their order in the line, the rows' and the trained-from version are renamed to those
numbers, and ``trainer.offpolicy.split_stale`` decides as it does for the single policy; a row from
no version of this line (the base model, another line) has no staleness and is kept.
"""

from __future__ import annotations

import pyarrow as pa

from trainer.offpolicy import source_of, split_stale
from trainer.registry import Registry, version_name


def split_stale_in_line(
    rows: pa.Table,
    *,
    registry: Registry,
    line: str | None,
    current_version: str | None,
    max_staleness: int | None,
) -> tuple[pa.Table, dict[str, int]]:
    """(rows to train on, rows skipped per source version): ``split_stale`` counted in ``line``'s versions."""
    if line is None or max_staleness is None or rows.num_rows == 0:
        return split_stale(rows, current_version=current_version, max_staleness=max_staleness)
    in_line = [r["version"] for r in registry.rows() if r["agent"] == line]
    ordinal = {v: version_name(k) for k, v in enumerate(in_line, start=1)}
    back = {o: v for v, o in ordinal.items()}
    renamed = []
    for pv in rows["policy_version"].to_pylist():
        src = source_of(pv)
        renamed.append(f"{line}@{ordinal[src]}" if src in ordinal else None)
    probe = pa.table({"policy_version": pa.array(renamed, pa.string()), "_row": pa.array(range(rows.num_rows))})
    current = ordinal.get(current_version) if current_version else None  # None: the base model (number 0)
    kept, skipped = split_stale(probe, current_version=current, max_staleness=max_staleness)
    return rows.take(kept["_row"]), {back.get(src, src): n for src, n in skipped.items()}
