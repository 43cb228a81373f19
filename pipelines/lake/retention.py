"""Per-table retention and the nightly maintenance: what the `maintenance` job runs, without Dagster.

Retention deletes rows older than ``lake.retention_days`` (by each table's time column, see
``pipelines.lake.forget.TIME_COLUMNS``) and records each delete in ``deletions``, so a rebuild from Kafka
drops the same rows. Their files go with the regular vacuum (Delta's 7 days, so readers of a recent
snapshot keep working); `agentlake forget` is the path that removes files at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipelines.lake.compaction import cluster_finished
from pipelines.lake.forget import Deletion, Selector, execute
from schemas.lake import VACUUM_RETENTION_HOURS, Lake
from schemas.tables import TABLES


def cutoffs(days: Mapping[str, int], now: dt.datetime) -> dict[str, dt.datetime]:
    """Each table's cutoff: rows timed before it are past their retention."""
    return {table: now - dt.timedelta(days=n) for table, n in sorted(days.items())}


def apply_retention(lake: Lake, days: Mapping[str, int], *, now: dt.datetime | None = None) -> list[Deletion]:
    """Delete every row past its table's retention; each table's delete recorded in ``deletions``."""
    now = now or dt.datetime.now(dt.UTC)
    done = []
    for table, cutoff in cutoffs(days, now).items():
        sel = Selector("retention", before=cutoff, tables=(table,))
        reason = f"retention: {days[table]} days"
        done.append(execute(lake, sel, requested_by="maintenance", reason=reason, now=now, vacuum=False))
    return done


@dataclass
class Maintenance:
    """What one maintenance run did, per table."""

    deleted: dict[str, int] = field(default_factory=dict)  # rows removed by retention
    clustered: dict[str, list[dt.date]] = field(default_factory=dict)  # days sorted by rollout id
    compacted: dict[str, int] = field(default_factory=dict)  # files rewritten
    vacuumed: dict[str, int] = field(default_factory=dict)  # files deleted


def maintain(
    lake: Lake,
    retention_days: Mapping[str, int],
    *,
    now: dt.datetime | None = None,
    vacuum_hours: int = VACUUM_RETENTION_HOURS,
    window: int = 2,
    log: Callable[[str], object] = lambda _: None,
) -> Maintenance:
    """Retention first, then cluster the days out of the hourly ``window`` that need it (pipelines.lake.compaction),
    then compact and vacuum every table (the deletes leave rewritten files to merge)."""
    out = Maintenance()
    for d in apply_retention(lake, retention_days, now=now):
        for name, res in d.tables.items():
            out.deleted[name] = out.deleted.get(name, 0) + res.rows
            log(f"{name}: retention removed {res.rows} rows before {d.selector.before} (version {res.version})")
    out.clustered = cluster_finished(lake, window=window, now=now, log=log).days
    for name in TABLES:
        metrics = lake.compact(name)
        if metrics is None:
            continue
        out.compacted[name] = int(metrics.get("numFilesRemoved", 0))
        out.vacuumed[name] = len(lake.vacuum(name, retention_hours=vacuum_hours))
        log(f"{name}: compacted {out.compacted[name]} files, vacuumed {out.vacuumed[name]}")
    return out
