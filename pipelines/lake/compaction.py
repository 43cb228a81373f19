"""Compaction of the days still being written (hourly), and clustering of the days that are done (nightly).

Every lake run adds a file per table to the current ``day`` partition (5,760 a day with a run every
15 s), and a gold step's replacement pays for each file of the newest day it cannot prune
(docs/capacity.md). Compacting only the recent days keeps that count bounded through the day, at the
cost of those days' traffic rather than the table's.

Once a day leaves that window, the nightly ``maintenance`` job clusters it by rollout id
(``Lake.cluster``): a rollout's id says nothing of its day, so reading or forgetting one rollout
reads every day, and only sorted files with small row groups let each reader skip all but one group
per day. A day is clustered when it leaves the window and again whenever it holds more than one small
file (late rows, a step's replacement); a day the job missed, or whose one big file a forget rewrote,
stays unsorted (slower lookups, nothing wrong) until ``agentlake lake cluster`` names it.
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
    out = RecentCompaction(recent_days(now or dt.datetime.now(dt.UTC), days))
    for name in day_tables(lake, tables):
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


def day_tables(lake: Lake, tables: Iterable[str] | None = None) -> list[str]:
    """``tables``, or every day-partitioned table of ``lake`` with its credit variants."""
    from pipelines.gold.variants import variant_names  # lazy: variants builds on the incremental steps

    return list(tables) if tables is not None else [*DAY_TABLES, *map(transitions_variant, variant_names(lake))]


# delta-rs's optimize writes files of up to 100 MiB unless the table sets delta.targetFileSize; a file below
# half of that is a late append, a step's rewrite or an optimize's remainder, not one of its full files.
SMALL_FILE_BYTES = 50 * 2**20


def small_files_per_day(lake: Lake, name: str) -> dict[dt.date, int]:
    """How many small data files each ``day`` partition of ``name`` holds now (from the Delta log, no data read).

    Why small ones only: a clustered busy day is several full files and one remainder, and must not count
    as needing clustering again; a file appended to it later is small.
    """
    table = lake.table(name)
    if table is None:
        return {}
    actions = table.get_add_actions(flatten=True)
    days, sizes = actions.column("partition.day").to_pylist(), actions.column("size_bytes").to_pylist()
    out: dict[dt.date, int] = {}
    for day, size in zip(days, sizes, strict=True):
        key = day if isinstance(day, dt.date) else dt.date.fromisoformat(str(day))
        out[key] = out.get(key, 0) + (1 if size < SMALL_FILE_BYTES else 0)
    return out


def finished_days(files: dict[dt.date, int], *, window: int, now: dt.datetime) -> list[dt.date]:
    """The days to cluster tonight: the one just out of the hourly window, and every older one with several
    small files (``small_files_per_day``)."""
    newest_recent = recent_days(now, window)[-1]
    leaving = newest_recent - dt.timedelta(days=1)
    return sorted(d for d, n in files.items() if d == leaving or (d < leaving and n > 1))


@dataclass
class Clustering:
    """What one nightly clustering did: the days rewritten per table, and tables refused by concurrent commits."""

    days: dict[str, list[dt.date]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def cluster_finished(
    lake: Lake,
    *,
    window: int = 2,
    now: dt.datetime | None = None,
    tables: Iterable[str] | None = None,
    attempts: int = 3,
    log: Callable[[str], object] = lambda _: None,
) -> Clustering:
    """Cluster by rollout id the days out of the hourly compaction's ``window`` that need it (``finished_days``)."""
    when = now or dt.datetime.now(dt.UTC)
    out = Clustering()
    for name in day_tables(lake, tables):
        days = finished_days(small_files_per_day(lake, name), window=window, now=when)
        if not days:
            continue
        try:
            lake.cluster(name, days=days, attempts=attempts)
        except CommitFailedError as exc:
            out.refused[name] = str(exc).splitlines()[0]
            log(f"{name}: clustering refused {attempts} times by concurrent commits, left for the next night: {exc}")
            continue
        out.days[name] = days
        log(f"{name}: clustered by rollout id in days {_shown(days)}")
    return out


def _shown(days: list[dt.date]) -> str:
    first, last = min(days).isoformat(), max(days).isoformat()
    return ", ".join(d.isoformat() for d in sorted(days)) if len(days) <= 3 else f"{first} to {last}"
