"""Forget: delete rows from every lake table, make their files really gone, and record it.

A deletion is a ``Selector``: a tenant's rows (all of them, one rollout, or every rollout begun
before a time), or, for retention, every row of some tables older than a cutoff. ``plan`` turns it
into one Delta delete predicate per table and the rows it matches (pure: Polars frames in, plan out);
``execute`` runs the deletes, records the deletion in the ``deletions`` table, then vacuums the
touched tables with a retention of 0 hours: the delete only writes a new snapshot, and the removed
files (and every older file holding the same rows: pre-compaction files, overwritten trajectories)
stay on disk until a vacuum removes them.

Kafka stays the log of record. Incremental runs do not bring forgotten rows back: each step starts
after the Kafka offsets its table recorded (app transactions, untouched by a delete). A rebuild from
Kafka (``pipelines.lake.replay``) re-applies every recorded deletion (``honour``).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Literal

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, WriterProperties

from pipelines.errors import UnknownTenantError
from schemas import topics
from schemas.lake import CLUSTER_ROW_GROUP_ROWS, Lake, in_list, sql_string
from schemas.tables import DELETIONS, PARTITION_COLUMNS, base_table, transitions_variant

# Tables a deletion reaches: every table that holds a tenant's data or ids of its rollouts (`judgements`,
# the LLM judge's cache, holds its words about them). `model_versions` holds none; `deletions` is the
# record of deletions and is never deleted from.
FORGET_TABLES = ("spans", "rewards", "trajectories", "transitions", "training_lineage", "quarantine", "judgements")
# Tables whose rows name their tenant (quarantine's in its headers): where `known_tenant` looks
TENANT_TABLES = ("spans", "rewards", "trajectories", "transitions", "quarantine")
# The column a "before" cutoff compares with, per table (a date column: rows of days before the cutoff's).
TIME_COLUMNS = {
    "spans": "start_time",
    "rewards": "event_time",
    "trajectories": "start_time",
    "transitions": "day",
    "quarantine": "quarantined_at",
    "training_lineage": "consumed_at",
    "judgements": "created_at",
}
DELETION_KEY = "agentlake.deletion"  # commit metadata of each delete: the deletion id


def parse_before(text: str) -> dt.datetime:
    """A cutoff from ``YYYY-MM-DD`` (midnight UTC) or an ISO 8601 time (UTC when it names no zone)."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD) or an ISO 8601 time") from None
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


@dataclass(frozen=True)
class Selector:
    """What one deletion removes.

    ``kind="forget"``: the rows of ``tenant``; with ``rollout``, those of that rollout (every trace it
    resolved to, and rewards naming them); with ``before``, those of every rollout that began before it
    (all of that rollout, so a rebuild cannot reassemble its later half) and every other row of the
    tenant timed before it. ``kind="retention"``: every row of ``tables`` whose time column is before
    ``before``, whatever its tenant.
    """

    kind: Literal["forget", "retention"] = "forget"
    tenant: str | None = None
    rollout: str | None = None
    before: dt.datetime | None = None
    tables: tuple[str, ...] = FORGET_TABLES

    def __post_init__(self) -> None:
        if self.kind == "forget" and not self.tenant:
            raise ValueError("forget needs a tenant")
        if self.kind == "forget" and self.rollout is not None and self.before is not None:
            raise ValueError("forget takes a rollout or a before-time, not both")
        if self.kind == "retention" and self.before is None:
            raise ValueError("retention needs a cutoff")
        if self.before is not None and self.before.tzinfo is None:
            raise ValueError("the cutoff must carry a time zone")
        unknown = {t for t in self.tables if base_table(t) not in FORGET_TABLES}
        if unknown:
            raise ValueError(f"cannot delete from {', '.join(sorted(unknown))}")

    def describe(self) -> str:
        if self.kind == "retention":
            return f"rows before {self.before.isoformat() if self.before else '-'} in {', '.join(self.tables)}"
        what = f"rollout {self.rollout}" if self.rollout else "all rows"
        if self.before is not None:
            what = f"rollouts begun before {self.before.isoformat()}"
        return f"tenant {self.tenant}: {what}"


@dataclass(frozen=True)
class Cond:
    """One row filter in both languages it runs in: SQL for Delta's delete, Polars for the count."""

    sql: str
    expr: pl.Expr

    def __and__(self, other: Cond) -> Cond:
        if self is NONE or other is NONE:
            return NONE
        return Cond(f"({self.sql}) AND ({other.sql})", self.expr & other.expr)

    def __or__(self, other: Cond) -> Cond:
        if self is NONE:
            return other
        if other is NONE:
            return self
        return Cond(f"({self.sql}) OR ({other.sql})", self.expr | other.expr)


NONE = Cond("FALSE", pl.lit(False))


def _eq(column: str, value: str) -> Cond:
    return Cond(f"{column} = {sql_string(value)}", pl.col(column) == value)


def _in(column: str, values: Iterable[str]) -> Cond:
    vals = sorted(set(values))
    return Cond(in_list(column, vals), pl.col(column).is_in(vals)) if vals else NONE


def _older(column: str, cutoff: dt.datetime, dtype: pl.DataType | None) -> Cond:
    """``column < cutoff``; a date column compares days (rows of the cutoff's own day stay)."""
    utc = cutoff.astimezone(dt.UTC)
    if dtype == pl.Date:
        return Cond(f"{column} < '{utc.date().isoformat()}'", pl.col(column) < utc.date())
    text = utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Cond(f"{column} < '{text}'", pl.col(column) < utc)


@dataclass(frozen=True)
class TableDeletion:
    """One table's share of a plan: the Delta delete predicate and the rows it matches now."""

    table: str
    predicate: str
    rows: int


@dataclass(frozen=True)
class Plan:
    selector: Selector
    tables: tuple[TableDeletion, ...]
    rollouts: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)


def _dtype(frame: pl.LazyFrame, column: str) -> pl.DataType | None:
    return frame.collect_schema().get(column)


def _unique(frame: pl.LazyFrame | None, where: pl.Expr, column: str) -> set[str]:
    if frame is None:
        return set()
    col = pl.col(column)
    if isinstance(_dtype(frame, column), pl.List):
        col = col.explode()
    got = frame.filter(where).select(col.alias("_v")).drop_nulls().unique().collect()
    return set(got["_v"].to_list())


def quarantine_tenants(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Quarantined records with the tenant and receive time their headers carry (as decoding reads them)."""
    rows = frame.select("kafka_topic", "kafka_partition", "kafka_offset", "key", "headers", "quarantined_at").collect()

    def header(raw: str | None, name: str) -> str | None:
        try:
            value = json.loads(raw or "{}").get(name)
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None

    heads = rows["headers"].to_list()
    received = [header(h, topics.HEADER_RECEIVED_AT) for h in heads]
    return rows.with_columns(
        pl.Series("tenant", [header(h, topics.HEADER_TENANT) or topics.DEFAULT_TENANT for h in heads], pl.String),
        pl.Series(
            "key_text", [k.decode("utf-8", "replace") if k is not None else None for k in rows["key"]], pl.String
        ),
        pl.Series(
            "received_at",
            [dt.datetime.fromtimestamp(int(r) / 1e9, dt.UTC) if r and r.isdigit() else None for r in received],
            pl.Datetime("us", "UTC"),
        ),
    ).lazy()


def known_tenant(frames: Mapping[str, pl.LazyFrame], tenant: str) -> bool:
    """Whether any table holds a row of ``tenant``."""
    for name in ("spans", "rewards", "trajectories", "transitions"):
        frame = frames.get(name)
        if frame is not None and frame.filter(pl.col("tenant") == tenant).head(1).collect().height:
            return True
    q = frames.get("quarantine")
    return q is not None and quarantine_tenants(q).filter(pl.col("tenant") == tenant).head(1).collect().height > 0


@dataclass
class _Scope:
    """The rollouts a forget reaches, the traces they are made of and the LLM responses in them."""

    rollouts: set[str] = field(default_factory=set)
    traces: set[str] = field(default_factory=set)
    responses: set[str] = field(default_factory=set)
    # rows per day of the tenant's spans naming ``rollouts`` or in ``traces``, counted by the reads that
    # found them (a forget of one rollout); None when not counted
    spans_days: pl.DataFrame | None = None


def _scope(sel: Selector, frames: Mapping[str, pl.LazyFrame]) -> _Scope:
    spans, traj = frames.get("spans"), frames.get("trajectories")
    mine = pl.col("tenant") == sel.tenant
    out = _Scope()
    if sel.rollout is not None:
        out.rollouts = {sel.rollout}
    elif sel.before is not None:
        if spans is not None:
            early = mine & (pl.col("start_time") < sel.before)
            out.rollouts |= _unique(spans, early, "rollout_id")
            out.traces |= _unique(spans, early, "trace_id")
        if traj is not None:
            out.rollouts |= _unique(traj, mine & (pl.col("start_time") < sel.before), "rollout_id")
    else:  # the whole tenant: every rollout id it has anywhere (for tables without a tenant column)
        for name in ("spans", "trajectories", "transitions", "rewards"):
            out.rollouts |= _unique(frames.get(name), mine, "rollout_id")
        return out
    # a rollout's traces: those identity resolution filed under it, and those its spans name; and the LLM
    # responses in them. One read of spans finds both when the spans name no trace the trajectories do not list.
    # Each read of spans scans the id columns it filters on (nothing prunes a random id), so the reads also
    # count the rows a delete of the scope matches per day (the delete's day bound) rather than a read of its own
    named = pl.col("rollout_id").is_in(sorted(out.rollouts)).fill_null(False)
    out.traces |= _unique(traj, mine & named, "trace_ids")
    read = set(out.traces)  # traces whose every span the read below returns
    hits = _spans_of(spans, mine & (named | pl.col("trace_id").is_in(sorted(read))), named)
    out.traces |= set(hits.filter(pl.col("named"))["trace_id"].to_list())
    counted = [hits]  # the spans naming the rollouts or in the scope's traces, by day: none counted twice
    if unread := out.traces - read:  # traces read only where a span names the rollout: their other spans
        rest = _spans_of(spans, mine & pl.col("trace_id").is_in(sorted(unread)), named)
        hits = pl.concat([hits, rest])
        counted.append(rest.filter(~pl.col("named")))
    out.responses = set(hits["llm_response_id"].drop_nulls().to_list())
    # the gateway's record of a call sits in a trace of its own, linked by the response id
    gateway = _unique(spans, mine & pl.col("llm_response_id").is_in(sorted(out.responses)), "trace_id")
    new = gateway - out.traces  # none of their spans names the rollout (that would have put them in the scope)
    out.traces |= new
    if spans is not None and sel.before is None:  # a cutoff deletes more spans: the plan counts those itself
        if new:
            counted.append(spans.filter(mine & pl.col("trace_id").is_in(sorted(new))).group_by("day").len().collect())
        rows = pl.col("len").cast(pl.Int64)
        out.spans_days = pl.concat([c.select("day", rows) for c in counted]).group_by("day").agg(pl.col("len").sum())
    return out


def _spans_of(spans: pl.LazyFrame | None, where: pl.Expr, named: pl.Expr) -> pl.DataFrame:
    """The spans ``where`` picks, counted by trace, response, whether the span names the rollouts, and day."""
    if spans is None:
        schema = {"trace_id": pl.String, "llm_response_id": pl.String, "named": pl.Boolean, "day": pl.Date}
        return pl.DataFrame(schema=schema | {"len": pl.UInt32})
    return spans.filter(where).group_by("trace_id", "llm_response_id", named.alias("named"), "day").len().collect()


def _held_by_others(frames: Mapping[str, pl.LazyFrame], tenant: str, rollouts: set[str]) -> set[str]:
    """Rollout ids another tenant also uses: tables without a tenant column must keep their rows."""
    others = pl.col("tenant") != tenant
    held: set[str] = set()
    for name in ("trajectories", "transitions", "spans"):
        held |= _unique(frames.get(name), others & pl.col("rollout_id").is_in(sorted(rollouts)), "rollout_id")
    return held


def _forget_conds(sel: Selector, frames: Mapping[str, pl.LazyFrame], scope: _Scope) -> dict[str, Cond]:
    assert sel.tenant is not None
    mine = _eq("tenant", sel.tenant)
    whole = sel.rollout is None and sel.before is None
    r, tr = _in("rollout_id", scope.rollouts), _in("trace_id", scope.traces)

    def timed(name: str) -> Cond:
        frame = frames[name]
        column = TIME_COLUMNS[base_table(name) or name]
        return NONE if sel.before is None else _older(column, sel.before, _dtype(frame, column))

    conds: dict[str, Cond] = {}
    if whole:
        for name in ("spans", "rewards", "trajectories", "transitions"):
            conds[name] = mine
    else:
        conds["spans"] = mine & (r | tr | (timed("spans") if "spans" in frames else NONE))
        resp = _in("llm_response_id", scope.responses)
        conds["rewards"] = mine & (r | tr | resp | (timed("rewards") if "rewards" in frames else NONE))
        conds["trajectories"] = mine & r
        conds["transitions"] = mine & r
    # a judgement of a group that held a forgotten rollout goes whole: the judge's words compare members
    mine_expr = pl.col("tenant") == sel.tenant
    judged = set() if whole else _unique(frames.get("judgements"), mine_expr & r.expr, "judgement_id")
    conds["judgements"] = mine if whole else mine & _in("judgement_id", judged)
    for name in sel.tables:  # a credit variant holds the same rows as `transitions`
        if name != "transitions" and base_table(name) == "transitions":
            conds[name] = conds["transitions"]
    lineage = scope.rollouts - _held_by_others(frames, sel.tenant, scope.rollouts)
    conds["training_lineage"] = _in("rollout_id", lineage)
    return conds


def _quarantine_cond(sel: Selector, frame: pl.LazyFrame, scope: _Scope) -> Cond:
    """Quarantine has no tenant column: pick records by their headers and key, delete them by offset."""
    q = quarantine_tenants(frame)
    hit = pl.col("tenant") == sel.tenant
    if sel.rollout is not None or sel.before is not None:
        by_key = pl.col("key_text").is_in(sorted(scope.rollouts | scope.traces))
        when = pl.coalesce("received_at", "quarantined_at")
        hit = hit & (by_key | ((when < sel.before) if sel.before is not None else pl.lit(False)))
    found = q.filter(hit).select("kafka_topic", "kafka_partition", "kafka_offset").collect()
    cond = NONE
    for (topic, part), rows in sorted(found.group_by("kafka_topic", "kafka_partition"), key=lambda g: str(g[0])):
        offsets = sorted(int(o) for o in rows["kafka_offset"])
        at = _eq("kafka_topic", str(topic)) & Cond(f"kafka_partition = {int(part)}", pl.col("kafka_partition") == part)
        listed = Cond(f"kafka_offset IN ({', '.join(map(str, offsets))})", pl.col("kafka_offset").is_in(offsets))
        cond = cond | (at & listed)
    return cond


def plan(sel: Selector, frames: Mapping[str, pl.LazyFrame]) -> Plan:
    """The deletes that carry out ``sel`` on the tables in ``frames`` (name -> scan), with their row counts.

    Pure: nothing is written. Tables absent from ``frames`` (not created yet) are skipped.
    """
    scope = _Scope()
    conds: dict[str, Cond] = {}
    if sel.kind == "retention":
        assert sel.before is not None
        for name in sel.tables:
            if name in frames:
                column = TIME_COLUMNS[base_table(name) or name]
                conds[name] = _older(column, sel.before, _dtype(frames[name], column))
    else:
        scope = _scope(sel, frames)
        conds = _forget_conds(sel, frames, scope)
        if "quarantine" in sel.tables and "quarantine" in frames:
            conds["quarantine"] = _quarantine_cond(sel, frames["quarantine"], scope)
    out = []
    for name in sel.tables:
        cond = conds.get(name, NONE)
        if name not in frames or cond is NONE:
            continue
        if name == "spans" and scope.spans_days is not None:
            rows, predicate = _bounded(cond, scope.spans_days)  # counted by the scope's reads
        else:
            rows, predicate = _matched(
                frames[name], cond, by_day="day" in PARTITION_COLUMNS.get(base_table(name) or name, [])
            )
        if rows:
            out.append(TableDeletion(name, predicate, rows))
    return Plan(sel, tuple(out), tuple(sorted(scope.rollouts)))


def _matched(frame: pl.LazyFrame, cond: Cond, *, by_day: bool) -> tuple[int, str]:
    """The rows ``cond`` matches in ``frame``, and the delete predicate for them: in a table partitioned by
    day, bounded to the days that hold them, so the delete reads those days' files, not the whole table's
    (a row a later commit puts in another day is one a new plan finds: ``others_committed``)."""
    if not by_day:
        return int(frame.filter(cond.expr).select(pl.len()).collect().item()), cond.sql
    return _bounded(cond, frame.filter(cond.expr).group_by("day").len().collect())


def _bounded(cond: Cond, days: pl.DataFrame) -> tuple[int, str]:
    """The rows of ``days`` (day, len: the rows ``cond`` matches per day) and ``cond`` bounded to those days."""
    rows = int(days["len"].sum())
    if days["day"].null_count():
        return rows, cond.sql
    return rows, f"({cond.sql}) AND ({in_list('day', [d.isoformat() for d in sorted(days['day'])])})"


@dataclass
class TableResult:
    table: str
    rows: int = 0
    version: int | None = None
    files_removed: int = 0


@dataclass
class Deletion:
    """What ``execute`` did: rows removed per table, the versions of the deletes, files vacuumed."""

    deletion_id: str
    selector: Selector
    planned: Plan
    tables: dict[str, TableResult] = field(default_factory=dict)
    record_version: int | None = None

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())


def with_variants(lake: Lake, sel: Selector) -> Selector:
    """``sel`` reaching the credit variants of `transitions` too (copies of its rows; pipelines.gold.variants)."""
    from pipelines.gold.variants import variant_names  # lazy: variants builds on the incremental steps

    if "transitions" not in sel.tables:
        return sel
    extra = tuple(t for n in variant_names(lake) if (t := transitions_variant(n)) not in sel.tables)
    return replace(sel, tables=(*sel.tables, *extra)) if extra else sel


def frames_of(lake: Lake, tables: Iterable[str] = FORGET_TABLES) -> dict[str, pl.LazyFrame]:
    """A scan of each of ``tables`` that exists in ``lake``."""
    return snapshot(lake, tables)[0]


def snapshot(lake: Lake, tables: Iterable[str]) -> tuple[dict[str, pl.LazyFrame], dict[str, int]]:
    """A scan of each of ``tables`` that exists in ``lake``, and the table version each scan reads."""
    frames: dict[str, pl.LazyFrame] = {}
    versions: dict[str, int] = {}
    for name in tables:
        table = lake.table(name)
        if table is not None:
            frames[name], versions[name] = pl.scan_delta(table), table.version()
    return frames, versions


def others_committed(lake: Lake, versions: Mapping[str, int], tables: Iterable[str], deletion_id: str) -> bool:
    """Whether a commit other than deletion ``deletion_id``'s deletes landed on ``tables`` after ``versions``.

    Only such a commit can hold a row the plan made at ``versions`` would delete: without one, each table is
    its planned snapshot less the rows the plan's predicates matched, and a new plan finds nothing.
    """
    for name in tables:
        table = lake.table(name)
        if table is None:
            continue
        if name not in versions:
            return True  # created after the plan
        newer = table.version() - versions[name]
        if newer > 0 and any(c.get(DELETION_KEY) != deletion_id for c in table.history(limit=newer)):
            return True
    return False


def execute(
    lake: Lake,
    sel: Selector,
    *,
    requested_by: str | None = None,
    reason: str | None = None,
    now: dt.datetime | None = None,
    vacuum: bool = True,
    record: bool = True,
    passes: int = 3,
    require_tenant: bool = False,
) -> Deletion:
    """Delete what ``sel`` selects, record it in ``deletions``, then vacuum the touched tables.

    The plan is made again after the deletes, up to ``passes`` times, when another commit landed on a
    table since the plan's snapshot: a pipeline run that read the tables before the delete and committed
    after it would otherwise put the rows back. (On a quiet lake that second plan could find nothing, and
    it is as dear as the first: every table's scans for the rollout, its traces and responses.) The record
    is written before the vacuum, so a crash in between leaves a recorded deletion (rerun to vacuum).
    ``require_tenant``: ``UnknownTenantError``, with nothing deleted, when no table holds a row of the tenant.
    """
    now = now or dt.datetime.now(dt.UTC)
    sel = with_variants(lake, sel)
    did = uuid.uuid4().hex
    frames, versions = snapshot(lake, sel.tables)
    first = plan(sel, frames)
    if require_tenant:
        _require_tenant(lake, first, frames)
    out = Deletion(did, sel, first)
    current = first
    for _ in range(max(1, passes)):
        if not current.tables:
            break
        # one table's delete does not wait for another's: each rewrites the files of its own table
        with ThreadPoolExecutor(max_workers=len(current.tables)) as pool:
            done = list(pool.map(lambda step: _delete(lake, step, did), current.tables))
        for step, (deleted, version) in zip(current.tables, done, strict=True):
            res = out.tables.setdefault(step.table, TableResult(step.table))
            res.rows += step.rows if deleted is None else deleted  # None: whole files went (a partition-only predicate)
            res.version = version
        if not others_committed(lake, versions, sel.tables, did):
            break
        frames, versions = snapshot(lake, sel.tables)
        current = plan(sel, frames)
    if record and (sel.kind == "forget" or out.rows):
        out.record_version = lake.write(
            "deletions", deletion_row(out, requested_by=requested_by, reason=reason, now=now)
        )
    if vacuum:
        for name in out.tables:
            out.tables[name].files_removed = len(lake.vacuum(name, retention_hours=0))
    return out


def _delete(lake: Lake, step: TableDeletion, deletion_id: str) -> tuple[int | None, int]:
    """Run one table's delete; the rows Delta says it deleted (None when it does not say) and the new version."""
    table = lake.table(step.table)
    assert table is not None
    metrics = table.delete(
        step.predicate,
        commit_properties=CommitProperties(custom_metadata={DELETION_KEY: deletion_id}),
        # a rewritten file keeps a clustered day's small row groups (Lake.cluster), though not its
        # order: sorting the day again would cost a rewrite of the whole day per forget
        writer_properties=WriterProperties(max_row_group_size=CLUSTER_ROW_GROUP_ROWS),
    )
    deleted = metrics.get("num_deleted_rows")
    return (None if deleted is None else int(deleted)), table.version()


def deletion_row(d: Deletion, *, requested_by: str | None, reason: str | None, now: dt.datetime) -> pa.Table:
    """The ``deletions`` row of one deletion: the selector, rows and versions per table, who and when."""
    sel = d.selector
    removed = [{"table": t.table, "rows": t.rows, "version": t.version} for t in d.tables.values()]
    row = {
        "deletion_id": d.deletion_id,
        "kind": sel.kind,
        "tenant": sel.tenant,
        "rollout_id": sel.rollout,
        "before": sel.before,
        "tables": list(sel.tables),
        "removed": removed,
        "rows_removed": d.rows,
        "requested_by": requested_by or _user(),
        "reason": reason,
        "deleted_at": now,
    }
    return pa.Table.from_pylist([row], schema=DELETIONS)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        return "unknown"


def forget(
    lake: Lake,
    tenant: str,
    *,
    rollout: str | None = None,
    before: dt.datetime | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    dry_run: bool = False,
) -> Deletion:
    """Forget a tenant's rollout, its rollouts begun before ``before``, or all of it.

    ``UnknownTenantError`` (nothing deleted) when no table holds a row of ``tenant``. ``dry_run``
    returns the plan with nothing deleted or recorded.
    """
    sel = with_variants(lake, Selector("forget", tenant=tenant, rollout=rollout, before=before))
    if not dry_run:
        return execute(lake, sel, requested_by=requested_by, reason=reason, require_tenant=True)
    frames = frames_of(lake, sel.tables)
    planned = plan(sel, frames)
    _require_tenant(lake, planned, frames)
    return Deletion("", sel, planned)


def _require_tenant(lake: Lake, planned: Plan, frames: Mapping[str, pl.LazyFrame]) -> None:
    """``UnknownTenantError`` when no table holds a row of the plan's tenant. A plan that deletes a row of a
    table naming tenants answers it; only a plan that found nothing asks the tables (a scan each)."""
    tenant = planned.selector.tenant
    assert tenant is not None
    if any(base_table(t.table) in TENANT_TABLES for t in planned.tables) or known_tenant(frames, tenant):
        return
    raise UnknownTenantError(
        f"no table of the lake {lake.root} holds a row of tenant {tenant!r}: nothing was deleted "
        "(check the name; rows still waiting in Kafka are not in the lake yet)"
    )


def recorded(lake: Lake) -> list[Selector]:
    """Every deletion ``lake`` recorded, oldest first, as selectors to apply again."""
    scan = lake.scan("deletions")
    if scan is None:
        return []
    rows = scan.sort("deleted_at").collect().to_dicts()
    return [
        Selector(
            r["kind"],
            tenant=r["tenant"],
            rollout=r["rollout_id"],
            before=r["before"],
            tables=tuple(t for t in r["tables"] if t in FORGET_TABLES),
        )
        for r in rows
    ]


BRONZE = ("spans", "rewards", "quarantine")


def honour(lake: Lake, selectors: Iterable[Selector], *, only: tuple[str, ...] | None = None) -> int:
    """Apply recorded deletions again (to a lake rebuilt from Kafka); the rows removed.

    ``only`` limits them to some tables (the bronze ones, before silver and gold are built from them).
    Nothing is recorded: the records are copied with ``copy_records``. No vacuum: the caller's.
    """
    total = 0
    for sel in selectors:
        tables = tuple(t for t in sel.tables if only is None or t in only)
        if not tables:
            continue
        scoped = Selector(sel.kind, tenant=sel.tenant, rollout=sel.rollout, before=sel.before, tables=tables)
        total += execute(lake, scoped, record=False, vacuum=False).rows
    return total


def copy_records(source: Lake, target: Lake) -> int:
    """Copy ``source``'s deletion records into ``target`` (so a rebuild of the rebuild honours them too)."""
    scan = source.scan("deletions")
    if scan is None:
        return 0
    data = scan.collect().to_arrow()
    if data.num_rows:
        target.write("deletions", data)
    return data.num_rows
