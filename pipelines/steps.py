"""Incremental table updates: what each asset does, without Dagster (replay and tests call them too).

Each step reads "what is new" from its source tables using watermarks it stored itself (as Delta
app transactions in its own table), recomputes only the affected rollouts or groups, and replaces
their rows in one commit together with the new watermarks. Rerunning a step after a crash redoes
the same replacement: idempotent, never duplicated.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow.compute as pc

from pipelines.credit import RunningBaseline
from pipelines.lake import Lake, in_list
from pipelines.retokenize import Retokenizer
from pipelines.trajectories import assemble, empty_rewards
from pipelines.transitions import build
from schemas.config import CreditSettings, KafkaSettings

TRAJ_FROM_TRANSITIONS = "trajectories.updated_at"
BASELINE_KEY = "agentlake.running_baseline"


@dataclass
class StepResult:
    rows: int = 0
    rollouts: int = 0
    version: int | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        return {"rows": self.rows, "rollouts": self.rollouts, "delta_version": self.version or 0, **self.extra}


def _offset_ranges(
    lake: Lake, source: str, topic: str, target: str, prefix: str
) -> tuple[pl.Expr | None, dict[str, int]]:
    """Rows of ``source`` from ``topic`` not yet seen by ``target``, as a filter + new watermarks."""
    src = lake.table(source)
    if src is None:
        return None, {}
    parts = pl.scan_delta(src).filter(pl.col("kafka_topic") == topic).select("kafka_partition").unique().collect()
    cond: pl.Expr | None = None
    txns: dict[str, int] = {}
    for p in sorted(parts["kafka_partition"].to_list()):
        hi = src.transaction_version(f"kafka:{topic}:{p}")
        lo = lake.txn(target, f"{prefix}:{topic}:{p}")
        if hi is None or (lo is not None and lo >= hi):
            continue
        txns[f"{prefix}:{topic}:{p}"] = hi
        c = (pl.col("kafka_partition") == p) & (pl.col("kafka_offset") <= hi)
        if lo is not None:
            c = c & (pl.col("kafka_offset") > lo)
        cond = c if cond is None else cond | c
    if cond is not None:
        cond = (pl.col("kafka_topic") == topic) & cond
    return cond, txns


def update_trajectories(
    lake: Lake,
    kafka: KafkaSettings,
    *,
    idle_timeout_s: float,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
) -> StepResult:
    """Re-assemble every rollout touched by new spans, new reward events or the idle watermark.

    Rollouts are taken ``chunk_rollouts`` at a time, one commit each, so memory follows the chunk,
    not the backlog; the watermarks go in with the last chunk.
    """
    now = now or dt.datetime.now(dt.UTC)
    res = StepResult()
    spans_cond, span_txns = _offset_ranges(lake, "spans", kafka.spans_topic, "trajectories", "spans")
    ev_cond, ev_txns = _offset_ranges(lake, "rewards", kafka.rewards_topic, "trajectories", "rewards")
    spans = lake.scan("spans")
    if spans is None:
        return res
    affected: set[str] = set()
    # The earliest `day` partition known to hold a span of each affected rollout: loading their spans
    # then skips older partitions instead of scanning the whole table (which grows without end).
    first_day: dict[str, dt.date] = {}

    def note_days(frame: pl.DataFrame) -> None:
        for rid, day in zip(frame["rollout_id"].to_list(), frame["day"].to_list(), strict=True):
            if rid is not None and day is not None and (rid not in first_day or day < first_day[rid]):
                first_day[rid] = day

    if spans_cond is not None:
        new = spans.filter(spans_cond).group_by("rollout_id").agg(pl.col("day").min()).collect()
        affected.update(new["rollout_id"].to_list())
        note_days(new)
    rewards = lake.scan("rewards")
    if ev_cond is not None and rewards is not None:
        ev = rewards.filter(ev_cond).select("rollout_id", "trace_id", "llm_response_id").collect()
        affected.update(x for x in ev["rollout_id"].to_list() if x)
        traces = [x for x in ev["trace_id"].to_list() if x]
        resp = [x for x in ev["llm_response_id"].to_list() if x]
        if traces or resp:
            hit = (
                spans.filter(pl.col("trace_id").is_in(traces) | pl.col("llm_response_id").is_in(resp))
                .group_by("rollout_id")
                .agg(pl.col("day").min())
                .collect()
            )
            affected.update(hit["rollout_id"].to_list())
            note_days(hit)
    traj = lake.scan("trajectories")
    if traj is not None:
        cutoff = now - dt.timedelta(seconds=idle_timeout_s)
        stale = traj.filter((pl.col("status") == "running") & (pl.col("end_time") < cutoff)).select("rollout_id")
        affected.update(stale.collect()["rollout_id"].to_list())
        # Every span already in `spans` was assembled into its trajectory when it was new, and a
        # trajectory's day is its earliest span's: so no older partition can hold one of its spans.
        known = (
            traj.filter(pl.col("rollout_id").is_in(sorted(affected)))
            .group_by("rollout_id")
            .agg(pl.col("day").min())
            .collect()
        )
        note_days(known)
    txns = {**span_txns, **ev_txns}
    ids = sorted(affected)
    for start in range(0, max(len(ids), 1), chunk_rollouts):
        chunk = ids[start : start + chunk_rollouts]
        last = start + chunk_rollouts >= len(ids)
        if not chunk:
            if txns:
                res.version = lake.write("trajectories", _empty("trajectories"), txns=txns)
            break
        in_chunk = pl.col("rollout_id").is_in(chunk)
        days = [first_day.get(r) for r in chunk]
        if all(d is not None for d in days):
            in_chunk = (pl.col("day") >= min(days)) & in_chunk  # type: ignore[type-var]
        rows = spans.filter(in_chunk).collect()
        events = empty_rewards()
        if rewards is not None:
            traces = rows["trace_id"].unique().to_list()
            resp = rows["llm_response_id"].drop_nulls().unique().to_list()
            events = rewards.filter(
                (pl.col("source") == "event")
                & (
                    pl.col("rollout_id").is_in(chunk)
                    | pl.col("trace_id").is_in(traces)
                    | pl.col("llm_response_id").is_in(resp)
                )
            ).collect()
        table = assemble(rows, events, now=now, idle_timeout_s=idle_timeout_s)
        res.version = lake.write(
            "trajectories",
            table,
            txns=txns if last else None,
            mode="overwrite",
            predicate=in_list("rollout_id", chunk),
        )
        res.rows += table.num_rows
        res.rollouts += len(chunk)
        status = pc.value_counts(table.column("status")).to_pylist()
        for count in status:
            if count["values"] in ("finished", "running"):
                res.extra[count["values"]] = res.extra.get(count["values"], 0) + count["counts"]
    if res.rows:
        res.extra.setdefault("finished", 0)
        res.extra.setdefault("running", 0)
    return res


def _empty(name: str) -> Any:
    from schemas.tables import TABLES

    return TABLES[name].empty_table()


def update_transitions(
    lake: Lake,
    credit: CreditSettings,
    *,
    retokenizer: Retokenizer | Callable[[], Retokenizer | None] | None = None,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
) -> StepResult:
    """Recompute the transitions of every group (task) with a changed trajectory.

    Groups are taken in chunks of about ``chunk_rollouts`` changed trajectories, one commit each,
    so memory follows the chunk, not the backlog; the watermark goes in with the last chunk, and a
    crash in between redoes the same replacements. The running baseline carries from chunk to chunk.
    """
    now = now or dt.datetime.now(dt.UTC)
    res = StepResult()
    traj = lake.scan("trajectories")
    if traj is None:
        return res
    mark = lake.txn("transitions", TRAJ_FROM_TRANSITIONS)
    changed = traj
    if mark is not None:
        changed = traj.filter(pl.col("updated_at") > dt.datetime.fromtimestamp(mark / 1e6, dt.UTC))
    keys = changed.select(
        pl.coalesce("task_id", "rollout_id").alias("group_id"), pl.col("updated_at").dt.epoch("us")
    ).collect()
    if keys.is_empty():
        return res
    new_mark = int(keys["updated_at"].max())  # type: ignore[arg-type]
    sizes = keys.group_by("group_id").len().sort("group_id")
    chunks = _group_chunks(sizes["group_id"].to_list(), sizes["len"].to_list(), chunk_rollouts)
    baseline = None
    if credit.advantage == "running_baseline":
        baseline = RunningBaseline.from_json(_saved_baseline(lake))
    dropped: dict[str, int] = {}
    mismatches = 0
    reward_sum, rewarded = 0.0, 0
    for i, groups in enumerate(chunks):
        rows = traj.filter(pl.coalesce("task_id", "rollout_id").is_in(groups)).collect()
        out = build(rows, credit, now=now, retokenizer=retokenizer, baseline=baseline)
        baseline = out.baseline
        last = i == len(chunks) - 1
        # The baseline goes in with the watermark: a rerun after a crash between chunks starts again
        # from the baseline the watermark belongs to, and counts no rollout twice.
        res.version = lake.write(
            "transitions",
            out.table,
            txns={TRAJ_FROM_TRANSITIONS: new_mark} if last else None,
            mode="overwrite",
            predicate=in_list("group_id", groups),
            metadata={BASELINE_KEY: baseline.to_json()} if last and baseline is not None else None,
        )
        res.rows += out.table.num_rows
        res.rollouts += out.rollouts
        mismatches += out.merge_mismatches
        for reason, n in out.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
        reward = out.table.column("reward")
        reward_sum += float(pc.sum(reward).as_py() or 0.0)
        rewarded += len(reward) - reward.null_count
    res.extra = {
        "groups": int(sizes.height),
        "commits": len(chunks),
        "merge_mismatches": mismatches,
        **{f"dropped_{k}": v for k, v in sorted(dropped.items())},
    }
    if rewarded:
        res.extra["reward_mean"] = reward_sum / rewarded
    return res


def _saved_baseline(lake: Lake) -> str | None:
    """The running baseline of the newest `transitions` commit that carries one.

    Not simply the newest commit's: chunk commits before the last one and compaction commits carry
    none, and reading those as "no baseline" would start it over.
    """
    table = lake.table("transitions")
    if table is None:
        return None

    def newest_first() -> Iterator[dict[str, Any]]:
        recent = table.history(64)  # almost always holds it; the whole log is read only when not
        yield from recent
        if len(recent) == 64:
            yield from table.history()[64:]

    return next((c[BASELINE_KEY] for c in newest_first() if BASELINE_KEY in (c or {})), None)


def _group_chunks(groups: list[str], sizes: list[int], limit: int) -> list[list[str]]:
    """Consecutive groups in chunks of at most ``limit`` rows (a bigger group is a chunk of its own)."""
    chunks: list[list[str]] = []
    current: list[str] = []
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
