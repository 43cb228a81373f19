"""`agentlake query | tables | replay | lake ...`: the lake from the command line (logic in pipelines).

The lake is the settings' (``lake.root``; empty: the local stack's, in the object store's bucket by
default), on a folder or an object store alike.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import pyarrow as pa
import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit

if TYPE_CHECKING:  # imported lazily, at the call
    from schemas.config import Settings
    from schemas.lake import Lake


def _lake(config: str | None) -> tuple[Settings, Lake]:
    from schemas.lake import Lake

    s = settings_or_exit(config)
    return s, Lake.from_settings(s)


def _render(table: pa.Table, fmt: str, output: str | None) -> None:
    if fmt == "table":
        t = Table(show_lines=False)
        for name in table.column_names:
            t.add_column(name)
        for row in table.to_pylist():
            t.add_row(*("" if v is None else str(v) for v in row.values()))
        console.print(t)
        console.print(f"[dim]{table.num_rows} rows[/]")
        return
    if fmt == "parquet":
        import pyarrow.parquet as pq

        if not output:
            raise typer.BadParameter("--format parquet needs --output FILE")
        pq.write_table(table, output)
        return
    stream = open(output, "w", newline="") if output else sys.stdout
    try:
        if fmt == "csv":
            import csv

            w = csv.writer(stream)
            w.writerow(table.column_names)
            for row in table.to_pylist():
                w.writerow(list(row.values()))
        else:
            for row in table.to_pylist():
                stream.write(json.dumps(row, default=str) + "\n")
    finally:
        if output:
            stream.close()


@app.command()
@handle_errors
def query(
    sql: str = typer.Argument(..., help="SQL over the views spans, rewards, trajectories, transitions, ..."),
    fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
    output: str | None = typer.Option(None, "--output", "-o", help="write to a file instead of stdout"),
    config: str | None = ConfigOption,
) -> None:
    """Run SQL on the lake with DuckDB (one view per Delta table)."""
    from pipelines.lake.query import run_query

    if fmt not in ("table", "csv", "json", "parquet"):
        raise typer.BadParameter("--format must be table, csv, json or parquet")
    _, lake = _lake(config)
    try:
        result = run_query(lake, sql)
    except Exception as exc:  # duckdb errors: show the message, not a traceback
        if type(exc).__module__.startswith("duckdb") or type(exc).__module__.startswith("_duckdb"):
            console.print(f"[bold red]query failed:[/] {exc}")
            raise typer.Exit(1) from exc
        raise
    _render(result, fmt, output)


@app.command()
@handle_errors
def tables(config: str | None = ConfigOption) -> None:
    """List the lake's tables with row counts and Delta versions."""
    from pipelines.lake.query import list_tables

    _, lake = _lake(config)
    t = Table("table", "rows", "version", "files", "path")
    for info in list_tables(lake):
        version = "-" if info.version is None else str(info.version)
        t.add_row(info.name, str(info.rows), version, str(info.files), info.path)
    console.print(t)


@app.command()
@handle_errors
def replay(
    lake_root: str = typer.Option(..., "--lake", help="a fresh lake root to rebuild into"),
    config: str | None = ConfigOption,
) -> None:
    """Rebuild every table from Kafka into a fresh lake root."""
    from pipelines.lake.replay import replay as run_replay
    from schemas.lake import Lake

    s = settings_or_exit(config)
    if not s.kafka.bootstrap_servers:
        console.print("[bold red]error:[/] no Kafka address: run `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        raise typer.Exit(2)
    out = run_replay(s, Lake(lake_root, dict(s.lake.storage_options)))
    for step, res in out.items():
        console.print(f"{step}: {res if isinstance(res, int) else res.metadata()}")


lake_app = typer.Typer(
    name="lake", help="Lake maintenance: ingest, compact, vacuum, accept a reset Kafka log.", no_args_is_help=True
)
app.add_typer(lake_app, name="lake")


@lake_app.command("accept-reset")
@handle_errors
def accept_reset(
    topic: str = typer.Option("all", "--topic", help="spans | rewards | all"),
    config: str | None = ConfigOption,
) -> None:
    """Ingest a reset Kafka log (a restarted in-memory broker, a recreated topic) from its first record.

    Ingestion stops when a partition no longer holds the record at the lake's watermark.
    This checks each topic the same way and, where its log was reset, records a new epoch in the table's history.
    The new log's records are then stored after every offset the lake already holds.
    A log that was not reset is left alone.
    """
    from pipelines.bronze.log_reset import accept_reset as accept

    if topic not in ("spans", "rewards", "all"):
        raise typer.BadParameter("--topic must be spans, rewards or all")
    s, lake = _lake(config)
    if not s.kafka.bootstrap_servers:
        console.print("[bold red]error:[/] no Kafka address: run `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        raise typer.Exit(2)
    for kind in ("spans", "rewards") if topic == "all" else (topic,):
        done = accept(lake, s.kafka, kind)
        name = s.kafka.spans_topic if kind == "spans" else s.kafka.rewards_topic
        if done is None:
            console.print(f"{kind}: the log of {name} holds what the lake ingested; nothing to accept")
            continue
        console.print(f"{kind}: accepted epoch {done['epoch']} of {name} (table version {done['version']})")
        for p, part in sorted(done["partitions"].items(), key=lambda kv: int(kv[0])):
            console.print(f"  partition {p}: {part['broker']}; new records from lake offset {part['base']}")


@lake_app.command("ingest")
@handle_errors
def ingest_cmd(
    topic: str = typer.Option("spans", "--topic", help="spans | rewards"),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="processes sharing the topic's partitions (default: [ingest] workers)"
    ),
    worker: int | None = typer.Option(
        None, "--worker", min=0, help="run only worker I of --workers here (one per machine or container)"
    ),
    config: str | None = ConfigOption,
) -> None:
    """Ingest a topic into its bronze table until caught up, exactly once, by one or N workers.

    Worker i of N owns the partitions p with p % N == i; workers of one N may run at once, here as
    processes or (``--worker``) anywhere. A run whose partitions another run committed first stops.
    """
    from pipelines.bronze.ingest import ingest
    from pipelines.bronze.positions import Kind
    from pipelines.bronze.workers import decoders_per_worker, ingest_workers, worker_partitions

    if topic not in ("spans", "rewards"):
        raise typer.BadParameter("--topic must be spans or rewards")
    s, lake = _lake(config)
    if not s.kafka.bootstrap_servers:
        console.print("[bold red]error:[/] no Kafka address: run `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        raise typer.Exit(2)
    kind: Kind = "spans" if topic == "spans" else "rewards"
    n = workers or s.ingest.workers
    if worker is None:
        res = ingest_workers(lake, s.kafka, kind, workers=n, decoders=s.ingest.decoders)
    else:
        if worker >= n:
            raise typer.BadParameter(f"--worker must be below --workers ({n})")
        from pipelines.bronze.fetch import make_fetcher, topic_partitions

        name = s.kafka.spans_topic if kind == "spans" else s.kafka.rewards_topic
        probe = make_fetcher(s.kafka)
        try:
            owned = worker_partitions(topic_partitions(probe, name), worker, n)
        finally:
            probe.close()
        if not owned:
            raise typer.BadParameter(f"worker {worker} of {n} owns none of {name}'s partitions: use fewer workers")
        res = ingest(lake, s.kafka, kind, partitions=owned, workers=decoders_per_worker(kind, n, s.ingest.decoders))
    console.print(f"{kind}: {json.dumps(res.metadata())}")


def _tables(table: str) -> list[str]:
    """The tables ``--table`` names: all known ones, or one (a credit variant ``transitions__<name>`` too)."""
    from schemas.tables import TABLES, base_table

    if table != "all" and base_table(table) is None:
        raise typer.BadParameter(f"--table must be all, one of {', '.join(TABLES)}, or a variant transitions__<name>")
    return list(TABLES) if table == "all" else [table]


@lake_app.command("compact")
@handle_errors
def compact(
    table: str = typer.Option("all", "--table", help="a table name, or all"),
    recent_days: int | None = typer.Option(
        None,
        "--recent-days",
        min=1,
        help="only the newest N day partitions of the day-partitioned tables (what the hourly schedule runs)",
    ),
    config: str | None = ConfigOption,
) -> None:
    """Rewrite each table's small files into large ones (Delta optimize); rows and positions are unchanged."""
    _, lake = _lake(config)
    if recent_days is not None:
        from pipelines.lake.compaction import DAY_TABLES, compact_recent
        from schemas.tables import base_table

        names = None if table == "all" else _tables(table)
        if names is not None and any(base_table(n) not in DAY_TABLES for n in names):
            raise typer.BadParameter(f"--recent-days needs a table partitioned by day: {', '.join(DAY_TABLES)}")
        done = compact_recent(lake, days=recent_days, tables=names)
        for name in sorted(done.files_removed):
            console.print(
                f"{name}: {done.files_removed[name]} files -> {done.files_added[name]} (version {lake.version(name)})"
            )
        for name, why in sorted(done.refused.items()):
            console.print(f"{name}: refused by concurrent commits, not compacted ({why})")
        return
    for name in _tables(table):
        metrics = lake.compact(name)
        if metrics is None:
            continue
        console.print(
            f"{name}: {metrics.get('numFilesRemoved', 0)} files -> {metrics.get('numFilesAdded', 0)} "
            f"(version {lake.version(name)})"
        )


DayOption = typer.Option(None, "--day", help="a day partition to cluster (YYYY-MM-DD); repeat for more")


@lake_app.command("cluster")
@handle_errors
def cluster(
    table: str = typer.Option("all", "--table", help="a day-partitioned table or variant, or all"),
    day: list[str] | None = DayOption,
    every_day: bool = typer.Option(False, "--all-days", help="every day partition (once, for a lake built before)"),
    config: str | None = ConfigOption,
) -> None:
    """Sort day partitions by rollout id into small row groups, so reading or forgetting one rollout skips the rest.

    Without --day or --all-days: the days the nightly maintenance would cluster now.
    """
    import datetime as dt

    from pipelines.lake.compaction import DAY_TABLES, cluster_finished, day_tables, small_files_per_day
    from schemas.tables import base_table

    settings, lake = _lake(config)
    names = None if table == "all" else _tables(table)
    if names is not None and any(base_table(n) not in DAY_TABLES for n in names):
        raise typer.BadParameter(f"--table must be partitioned by day: {', '.join(DAY_TABLES)} or a variant")
    try:
        days = [dt.date.fromisoformat(d) for d in day or []]
    except ValueError:
        raise typer.BadParameter(f"--day takes dates as YYYY-MM-DD, got {', '.join(day or [])}") from None
    if days or every_day:
        for name in day_tables(lake, names):
            chosen = days or sorted(small_files_per_day(lake, name))
            if chosen and lake.cluster(name, days=chosen) is not None:
                console.print(f"{name}: {len(chosen)} days clustered (version {lake.version(name)})")
        return
    done = cluster_finished(lake, window=settings.lake.compact_days, tables=names)
    for name, clustered in sorted(done.days.items()):
        console.print(f"{name}: {len(clustered)} days clustered (version {lake.version(name)})")
    for name, why in sorted(done.refused.items()):
        console.print(f"{name}: refused by concurrent commits, not clustered ({why})")
    if not done.days and not done.refused:
        console.print("nothing to cluster: every finished day is clustered")


@lake_app.command("vacuum")
@handle_errors
def vacuum(
    table: str = typer.Option("all", "--table", help="a table name, or all"),
    retention_hours: int = typer.Option(
        168, "--retention-hours", min=0, help="keep files newer snapshots or this many hours of history read"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the files only"),
    config: str | None = ConfigOption,
) -> None:
    """Delete files that no snapshot within the retention reads (after compaction or rewrites)."""
    _, lake = _lake(config)
    for name in _tables(table):
        removed = lake.vacuum(name, retention_hours=retention_hours, dry_run=dry_run)
        console.print(f"{name}: {'would delete' if dry_run else 'deleted'} {len(removed)} files")
