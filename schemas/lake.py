"""The lake: where each Delta table lives and the few Delta operations the pipeline needs.

Plain code (no Dagster) so ingestion subprocesses, the CLI and replay share it. Every write that
consumes a source records how far it got as a Delta app transaction in the same commit, which is
what makes reruns exactly-once: the table itself says what it already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any, Literal

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from schemas.errors import ConcurrentWriteError, LakeError
from schemas.tables import PARTITION_COLUMNS, TABLES, base_table, table_configuration
from schemas.uris import table_uri

if TYPE_CHECKING:
    from schemas.config import Settings

VACUUM_RETENTION_HOURS = 168  # Delta's default: readers of a week-old snapshot still find their files
# A clustered file's row groups: small enough that a reader of one id reads a few thousand rows of each
# file, large enough that a file of a busy day holds hundreds of groups, not tens of thousands.
CLUSTER_ROW_GROUP_ROWS = 8192


def _day_filters(name: str, days: Sequence[date] | None) -> list[tuple[str, str, Any]] | None:
    """delta-rs partition filters for ``days`` of a table partitioned by day; None for the whole table."""
    if days is None:
        return None
    if PARTITION_COLUMNS[base_table(name) or name] != ["day"]:
        raise LakeError(f"{name} is not partitioned by day: optimize it whole")
    return [("day", "in", sorted({d.isoformat() for d in days}))]


def _retried(table: DeltaTable, attempts: int, optimize: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    """Run ``optimize`` again on the newer snapshot when a concurrent commit refused it; the last refusal raises."""
    for _ in range(attempts - 1):
        try:
            return dict(optimize())
        except CommitFailedError:
            table.update_incremental()
    return dict(optimize())


@dataclass(frozen=True)
class Lake:
    """A lake root (local folder or object-store URI) and its storage options."""

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> Lake:
        """The settings' lake (``lake.root`` resolved by ``load_settings``: the local stack's one when empty).

        A ``LakeError`` when that lake is in the local object store and the store is not running, rather
        than a wait on a refused connection or an empty folder in its place.
        """
        if settings.lake.unavailable:
            raise LakeError(settings.lake.unavailable)
        return cls(settings.lake.root, dict(settings.lake.storage_options))

    def uri(self, table: str) -> str:
        """Where ``table`` lives: a known table, or a variant of one (``transitions__<name>``, schemas.tables)."""
        _schema_of(table)
        return table_uri(self.root, table)  # one spelling per location (schemas.uris)

    def _opts(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None

    def table(self, name: str, *, version: int | None = None) -> DeltaTable | None:
        """The Delta table (at ``version``: time travel; default the newest), or None when nothing was written yet."""
        try:
            return DeltaTable(self.uri(name), version=version, storage_options=self._opts())
        except TableNotFoundError:
            return None
        except OSError as exc:  # delta-rs gives up on a refused connection after its retries (~2 s)
            if "connect" not in str(exc).lower():
                raise
            where = self.storage_options.get("AWS_ENDPOINT_URL") or self.root
            raise LakeError(
                f"the lake {self.root} does not answer at {where}: if it is the local stack's object store, "
                f"run `agentlake up` ({str(exc).splitlines()[0]})"
            ) from exc

    def version(self, name: str) -> int | None:
        dt = self.table(name)
        return None if dt is None else dt.version()

    def txn(self, name: str, app_id: str) -> int | None:
        """The source position last committed into ``name`` by ``app_id`` (None: never)."""
        dt = self.table(name)
        return None if dt is None else dt.transaction_version(app_id)

    def txns(self, name: str, app_ids: list[str]) -> dict[str, int | None]:
        dt = self.table(name)
        return {a: (None if dt is None else dt.transaction_version(a)) for a in app_ids}

    def scan(self, name: str) -> pl.LazyFrame | None:
        """A lazy Polars scan (None when the table does not exist yet)."""
        dt = self.table(name)
        if dt is None:
            return None
        return pl.scan_delta(dt)

    def compact(self, name: str, *, days: Sequence[date] | None = None, attempts: int = 3) -> dict[str, Any] | None:
        """Rewrite small files into large ones (a Delta ``optimize``); None when the table does not exist.

        Rows keep their ids and values, and a compaction commit sets no app transaction, so the source
        positions and the trainer's consumption are unchanged. ``days``: only those ``day`` partitions
        (a table partitioned by day), so the cost is those days' traffic, not the table's. A commit
        refused because a pipeline run rewrote files the compaction read is compacted again on the
        newer snapshot, up to ``attempts`` times in all; the last refusal propagates.
        """
        table = self.table(name)
        if table is None:
            return None
        filters = _day_filters(name, days)
        return _retried(table, attempts, lambda: table.optimize.compact(partition_filters=filters))

    def cluster(
        self,
        name: str,
        *,
        days: Sequence[date] | None = None,
        column: str = "rollout_id",
        row_group_rows: int = CLUSTER_ROW_GROUP_ROWS,
        attempts: int = 3,
    ) -> dict[str, Any] | None:
        """Rewrite ``days`` (or the whole table) sorted by ``column`` into row groups of ``row_group_rows``.

        Why: ids carry no time, so a lookup of one rollout cannot be pruned by day; in a clustered file
        each row group's min/max statistics span a narrow range of ids, and DuckDB, Polars and delta-rs
        read only the group that can hold the id. Unlike ``compact`` it rewrites every file of the
        chosen days (delta-rs's Z-order), so it is for days that are finished, once. None when the
        table does not exist; conflicts are retried as in ``compact``.
        """
        table = self.table(name)
        if table is None:
            return None
        filters = _day_filters(name, days)
        props = WriterProperties(max_row_group_size=row_group_rows)
        return _retried(
            table,
            attempts,
            lambda: table.optimize.z_order([column], partition_filters=filters, writer_properties=props),
        )

    def vacuum(self, name: str, *, retention_hours: int = VACUUM_RETENTION_HOURS, dry_run: bool = False) -> list[str]:
        """Delete files no snapshot newer than ``retention_hours`` reads; return them (``dry_run``: only list).

        Below Delta's 7-day default the caller asks for it explicitly: readers of older snapshots lose
        their files.
        """
        dt = self.table(name)
        if dt is None:
            return []
        removed = dt.vacuum(
            retention_hours=retention_hours,
            dry_run=dry_run,
            enforce_retention_duration=retention_hours >= VACUUM_RETENTION_HOURS,
        )
        if not dry_run:
            dt.cleanup_metadata()
        return list(removed)

    def pin(self, name: str) -> DeltaTable:
        """The table's current snapshot, creating the table empty first when it does not exist yet.

        A writer that reads its source positions from this snapshot and commits with it as
        ``snapshot=`` is exactly-once against concurrent writers (see ``write``). Creating first
        matters: two first writes to a missing table race for version 0, and delta-rs retries the
        loser on top of the winner without any conflict check.
        """
        dt = self.table(name)
        if dt is not None:
            return dt
        try:
            DeltaTable.create(
                self.uri(name),
                schema=_schema_of(name),
                partition_by=PARTITION_COLUMNS[base_table(name) or name] or None,
                configuration=table_configuration(name) or None,
                mode="ignore",
                storage_options=self._opts(),
            )
        except DeltaError:  # another writer created it at the same moment: use theirs
            pass
        dt = self.table(name)
        if dt is None:  # pragma: no cover - create succeeded or someone else's did
            raise LakeError(f"could not create the Delta table {self.uri(name)}")
        return dt

    def write(
        self,
        name: str,
        data: pa.Table,
        *,
        txns: Mapping[str, int] | None = None,
        mode: Literal["append", "overwrite"] = "append",
        predicate: str | None = None,
        metadata: Mapping[str, str] | None = None,
        snapshot: DeltaTable | None = None,
        expect: Mapping[str, int | None] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> int:
        """Write ``data`` and the source positions ``txns`` in one commit; return the new version.

        ``txns`` are positions (Delta app transactions): a commit never moves one below the value
        the snapshot holds (``ConcurrentWriteError``). ``marks`` are app transactions committed
        alongside without that rule (fingerprints, epochs).

        ``snapshot`` is the table as the caller read its positions (``pin``). The commit is based on
        it, so delta-rs refuses it (``ConcurrentWriteError``, nothing lands) when another commit since
        that snapshot set any of this commit's app ids; after the commit the object holds the new
        version, so a writer's next commit builds on its own last one. ``expect`` maps app ids to the
        values the caller read: the snapshot must still hold exactly those (it advances past other
        writers' commits when delta-rs retries a commit that did not conflict with them). Without
        ``snapshot`` the table is loaded here (created first when ``expect`` is given).
        """
        schema = _schema_of(name)
        data = data.select(schema.names).cast(schema)
        txns = dict(txns or {})
        dt = snapshot
        if dt is None:
            dt = self.pin(name) if expect is not None else self.table(name)
        if dt is not None:
            for app_id, want in (expect or {}).items():
                have = dt.transaction_version(app_id)
                if have != want:
                    raise ConcurrentWriteError(
                        f"{name}: {app_id} is at {_shown(have)} in version {dt.version()}, not at {_shown(want)} "
                        "as this writer read it: another writer committed these records first; nothing was "
                        "written, run again"
                    )
            for app_id, v in txns.items():
                have = dt.transaction_version(app_id)
                if have is not None and int(v) < have:
                    raise ConcurrentWriteError(
                        f"{name}: refusing to move {app_id} back from {have} to {v} (version {dt.version()}): "
                        "another writer committed further; nothing was written, run again"
                    )
        apps = {**txns, **(marks or {})}
        props = CommitProperties(
            app_transactions=[Transaction(app_id, int(v)) for app_id, v in apps.items()],
            custom_metadata=dict(metadata) if metadata else None,
        )
        kwargs: dict[str, Any] = {}
        if predicate is not None:
            kwargs["predicate"] = predicate
        if dt is not None and _field_paths(schema) - _field_paths(pa.schema(dt.schema().to_arrow())):
            # a table written under an older schema version gains the new (nullable) columns, nested
            # ones too (a field added to a struct of a list: trajectories' calls)
            kwargs["schema_mode"] = "merge"
        try:
            write_deltalake(
                dt if dt is not None else self.uri(name),
                data,
                mode=mode,
                partition_by=PARTITION_COLUMNS[base_table(name) or name] or None,
                storage_options=None if dt is not None else self._opts(),
                configuration=None if dt is not None else table_configuration(name) or None,
                commit_properties=props,
                **kwargs,
            )
        except CommitFailedError as exc:
            if not apps:
                raise
            raise ConcurrentWriteError(
                f"{name}: a concurrent commit set {', '.join(sorted(txns or apps))} since version "
                f"{'-' if dt is None else dt.version()} ({exc}); nothing was written, run again"
            ) from exc
        if dt is None:
            dt = self.table(name)
            assert dt is not None
        return dt.version()

    def insert_new(self, name: str, data: pa.Table, *, key: str) -> int:
        """Insert the rows of ``data`` whose ``key`` the table does not hold yet (a Delta MERGE); the count.

        One commit that checks and inserts together, so two writers racing for one key cannot both win;
        a missing table is created by the write of ``data``, and one written under an older schema gains
        the new (nullable) columns.
        """
        dt = self.table(name)
        if dt is None:
            self.write(name, data)
            return data.num_rows
        data = data.select(_schema_of(name).names).cast(_schema_of(name))
        stats = (
            dt.merge(data, predicate=f"t.{key} = s.{key}", source_alias="s", target_alias="t", merge_schema=True)
            .when_not_matched_insert_all()
            .execute()
        )
        return int(stats.get("num_target_rows_inserted", 0))

    def update(self, name: str, data: pa.Table, *, key: str, columns: Mapping[str, str]) -> int | None:
        """Set ``columns`` (target column -> expression over ``s.``, the rows of ``data``) on the rows whose
        ``key`` matches (a Delta MERGE, one new version); the count, or None when the table does not exist."""
        dt = self.table(name)
        if dt is None:
            return None
        stats = (
            dt.merge(data, predicate=f"t.{key} = s.{key}", source_alias="s", target_alias="t")
            .when_matched_update(updates=dict(columns))
            .execute()
        )
        return int(stats.get("num_target_rows_updated", 0))


def _schema_of(table: str) -> pa.Schema:
    """The schema of a known table or of a variant of one; a KeyError names the known tables."""
    base = base_table(table)
    if base is None:
        raise KeyError(
            f"unknown table {table!r}; expected one of {', '.join(TABLES)} or a variant such as transitions__<name>"
        )
    return TABLES[base]


def _field_paths(schema: pa.Schema) -> set[str]:
    """Every field's dotted path, into structs and lists of structs (``calls.policy_sha256``)."""
    paths: set[str] = set()

    def walk(prefix: str, typ: pa.DataType) -> None:
        while pa.types.is_list(typ) or pa.types.is_large_list(typ):
            typ = typ.value_type
        if pa.types.is_struct(typ):
            for child in typ:
                paths.add(f"{prefix}.{child.name}")
                walk(f"{prefix}.{child.name}", child.type)

    for f in schema:
        paths.add(f.name)
        walk(f.name, f.type)
    return paths


def _shown(position: int | None) -> str:
    return "unset" if position is None else str(position)


def sql_string(value: str) -> str:
    """A SQL string literal; Delta predicates are SQL text, so values are quoted, never pasted."""
    return "'" + value.replace("'", "''") + "'"


def read_matching(scan: pl.LazyFrame, where: pl.Expr, locator: Sequence[str]) -> pl.DataFrame:
    """The rows of ``scan`` (one Delta snapshot) that match ``where``, whole rows read only from the files
    that can hold one.

    Polars reads whole rows of every file a filter cannot prune, then filters: finding a chunk's
    10,000 rollouts in a day of 2.4M spans read all of that day (1.2 s for 400 rows). So this reads
    ``where``'s columns and the ``locator`` first (cheap: a few columns), then whole rows where the
    locator has one of the values found, which the files' statistics prune: ``locator`` columns are
    ones each commit writes a narrow range of (Kafka partition and offset for `spans`, the step's
    ``updated_at`` stamp for `trajectories`); the last is matched by value, the others grouped by. The
    result is exactly ``scan.filter(where)``: every matching row's locator is among those found.
    """
    *groups, last = locator
    found = scan.filter(where).select(*locator).unique().collect()
    if found.is_empty():
        return scan.clear().collect()
    if found.null_count().sum_horizontal().item():  # a null locator matches no value: read as it is
        return scan.filter(where).collect(engine="streaming")
    near: pl.Expr = pl.lit(False)
    for key, part in found.group_by(groups) if groups else [((), found)]:
        same = [pl.col(c) == v for c, v in zip(groups, key, strict=True)]
        near = near | pl.all_horizontal(*same, pl.col(last).is_in(part[last].unique().to_list()))
    return scan.filter(near & where).collect(engine="streaming")


def in_list(column: str, values: list[str]) -> str:
    """``column IN ('a', 'b')`` with each value quoted."""
    return f"{column} IN ({', '.join(sql_string(v) for v in values)})"


OffsetRanges = dict[int, tuple[int | None, int]]  # Kafka partition -> (offsets above, up to and including)


def unseen_ranges(
    source: DeltaTable,
    topic: str,
    *,
    watermark: Callable[[int], str],
    seen: Callable[[int], int | None],
) -> OffsetRanges:
    """Per partition of ``topic`` in a Kafka-fed ``source`` table, the offsets a reader has not read yet:
    above ``seen(p)`` (None: from the start) up to the source's own watermark (its app transaction
    ``watermark(p)``). Partitions with nothing new are left out.
    The one watermark scan of the lake: the trajectories step and the copy of reward spans use it.
    """
    out: OffsetRanges = {}
    for p in kafka_partitions(source, topic):
        hi = source.transaction_version(watermark(p))
        lo = seen(p)
        if hi is not None and (lo is None or lo < hi):
            out[p] = (lo, hi)
    return out


def kafka_partitions(source: DeltaTable, topic: str) -> list[int]:
    """Partitions the Kafka-fed ``source`` may hold rows of ``topic`` in: a superset, from its files' statistics.

    No data is read: the partition column's min and max per file are in the Delta log, so the cost follows
    the number of files, not of rows (reading the column itself was 0.1 s on a day of 2.4M spans, and grew
    with the lake). A file written without statistics sends it back to reading the column.
    """
    bounds = ["min.kafka_partition", "max.kafka_partition"]
    adds = pl.DataFrame(source.get_add_actions(flatten=True))
    if adds.is_empty():
        return []
    if any(c not in adds.columns for c in bounds) or adds.select(bounds).null_count().sum_horizontal().item():
        column = pl.scan_delta(source).filter(pl.col("kafka_topic") == topic).select("kafka_partition").unique()
        return sorted(column.collect()["kafka_partition"].to_list())
    spans = adds.select(bounds).unique().rows()
    return sorted({p for lo, hi in spans for p in range(int(lo), int(hi) + 1)})


def offsets_filter(topic: str, ranges: OffsetRanges) -> pl.Expr | None:
    """The rows of ``topic`` within ``ranges`` (None: no range)."""
    cond: pl.Expr | None = None
    for p, (lo, hi) in sorted(ranges.items()):
        c = (pl.col("kafka_partition") == p) & (pl.col("kafka_offset") <= hi)
        if lo is not None:
            c = c & (pl.col("kafka_offset") > lo)
        cond = c if cond is None else cond | c
    return None if cond is None else (pl.col("kafka_topic") == topic) & cond


def unseen_offsets(
    source: DeltaTable,
    topic: str,
    *,
    watermark: Callable[[int], str],
    seen: Callable[[int], int | None],
    seen_app: Callable[[int], str],
) -> tuple[pl.Expr | None, dict[str, int]]:
    """``unseen_ranges`` as a row filter (None: nothing new) and the watermarks the reader commits with
    what it builds from those rows (``seen_app(p)``: the reader's app id for partition ``p``)."""
    ranges = unseen_ranges(source, topic, watermark=watermark, seen=seen)
    return offsets_filter(topic, ranges), {seen_app(p): hi for p, (_, hi) in ranges.items()}
