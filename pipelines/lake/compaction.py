"""Compaction of the days still being written: the hourly half of the maintenance schedule.

Every lake run adds a file per table to the current ``day`` partition (5,760 a day with a run every
15 s), and a gold step's replacement pays for each file of the newest day it cannot prune
(docs/capacity.md). Compacting only the recent days keeps that count bounded through the day, at the
cost of those days' traffic rather than the table's; the nightly ``maintenance`` job does the rest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from deltalake.exceptions import CommitFailedError

from schemas.lake import Lake
from schemas.tables import PARTITION_COLUMNS, TABLES, transitions_variant

# The tables a lake run writes a file to on every run, all partitioned by day.
DAY_TABLES = tuple(name for name in TABLES if PARTITION_COLUMNS[name] == ["day"])


def recent_days(now: dt.datetime, days: int) -> list[dt.date]:
    """The ``days`` calendar days (UTC) up to and including ``now``'s, newest first.

    Two by default: late spans and rewards land in yesterday's partition for a while after midnight.
    """
    if days < 1:
        raise ValueError("compact at least 1 day")
    today = now.astimezone(dt.UTC).date()
    return [today - dt.timedelta(days=i) for i in range(days)]


@dataclass
class RecentCompaction:
    """What one compaction of the recent days did, per table."""

    days: list[dt.date]
    files_removed: dict[str, int] = field(default_factory=dict)
    files_added: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # table -> why its commit was refused every time


def compact_recent(
    lake: Lake,
    *,
    days: int = 2,
    now: dt.datetime | None = None,
    tables: Iterable[str] | None = None,
    attempts: int = 3,
    log: Callable[[str], object] = lambda _: None,
) -> RecentCompaction:
    """Compact the newest ``days`` day partitions of each day-partitioned table (credit variants too), or of
    ``tables`` (each partitioned by day: ``Lake.compact`` refuses another).

    A table whose commit concurrent pipeline runs refused ``attempts`` times is left as it is and
    named in ``refused``: its files stay until the next hour, nothing is lost.
    """
    from pipelines.gold.variants import variant_names  # lazy: variants builds on the incremental steps

    wanted = list(tables) if tables is not None else [*DAY_TABLES, *map(transitions_variant, variant_names(lake))]
    out = RecentCompaction(recent_days(now or dt.datetime.now(dt.UTC), days))
    for name in wanted:
        try:
            metrics = lake.compact(name, days=out.days, attempts=attempts)
        except CommitFailedError as exc:
            out.refused[name] = str(exc).splitlines()[0]
            log(f"{name}: compaction refused {attempts} times by concurrent commits, left for the next run: {exc}")
            continue
        if metrics is None:
            continue
        out.files_removed[name] = int(metrics.get("numFilesRemoved", 0))
        out.files_added[name] = int(metrics.get("numFilesAdded", 0))
        log(f"{name}: {out.files_removed[name]} files -> {out.files_added[name]} in days {_shown(out.days)}")
    return out


def _shown(days: list[dt.date]) -> str:
    first, last = min(days).isoformat(), max(days).isoformat()
    return ", ".join(d.isoformat() for d in sorted(days)) if len(days) <= 3 else f"{first} to {last}"
