"""The silver step: re-assemble every rollout touched by new spans, new reward events or idleness.

Incremental as `pipelines.steps` says: the `spans` and `rewards` offsets it has read go into
`trajectories` as app transactions, with the rows they produced.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipelines import keys
from pipelines.bronze.positions import app_id
from pipelines.silver.identity import resolve_rollouts
from pipelines.silver.trajectories import assemble, empty_rewards
from pipelines.steps import CommitChain, StepResult, offset_passes, pairs
from schemas import attributes as A
from schemas.config import KafkaSettings
from schemas.lake import Lake, offsets_filter, read_matching, unseen_offsets, unseen_ranges

REMOVED_KEY = "agentlake.removed_rollouts"  # trajectories commit metadata: rollouts deleted by it
SPAN_LOCATOR = ["kafka_topic", "kafka_partition", "kafka_offset"]  # where a span row sits: narrow per commit
# This step's commit chain (`pipelines.steps.CommitChain`): two runs planned on one snapshot cannot both
# commit, so rollouts the table has not seen can be appended rather than replaced.
STEP_MARK = "trajectories:step"


def _offset_ranges(
    lake: Lake, source: str, topic: str, target: str, prefix: str
) -> tuple[pl.Expr | None, dict[str, int]]:
    """Rows of ``source`` from ``topic`` not yet seen by ``target``, as a filter + new watermarks."""
    src = lake.table(source)
    if src is None:
        return None, {}
    return unseen_offsets(
        src,
        topic,
        watermark=lambda p: app_id(topic, p),
        seen=lambda p: lake.txn(target, _seen_app(prefix, topic, p)),
        seen_app=lambda p: _seen_app(prefix, topic, p),
    )


def _seen_app(prefix: str, topic: str, partition: int) -> str:
    """The app id under which `trajectories` records how far it read ``topic``'s ``partition`` of a source."""
    return f"{prefix}:{topic}:{partition}"


Pass = tuple[pl.Expr | None, dict[str, int]]  # a pass's row filter of `spans` and the watermarks it commits


def _span_passes(lake: Lake, spans: DeltaTable, topic: str, pass_records: int) -> list[Pass]:
    """The new spans of ``topic`` as passes of about ``pass_records`` records: each pass's row filter and the
    watermarks that go in with it."""
    traj = lake.table("trajectories")

    def seen(p: int) -> int | None:
        return None if traj is None else traj.transaction_version(_seen_app("spans", topic, p))

    def below(p: int) -> int:
        first = (
            pl.scan_delta(spans)
            .filter((pl.col("kafka_topic") == topic) & (pl.col("kafka_partition") == p))
            .select(pl.col("kafka_offset").min())
            .collect()
            .item()
        )
        return -1 if first is None else int(first) - 1

    ranges = unseen_ranges(spans, topic, watermark=lambda p: app_id(topic, p), seen=seen)
    return [
        (offsets_filter(topic, part), {_seen_app("spans", topic, p): hi for p, (_, hi) in part.items()})
        for part in offset_passes(ranges, pass_records, below)
    ]


def update_trajectories(
    lake: Lake,
    kafka: KafkaSettings,
    *,
    idle_timeout_s: float,
    reward_name: str | None = None,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
    pass_records: int = 50_000,
) -> StepResult:
    """Re-assemble every rollout touched by new spans, new reward events or the idle watermark.

    A rollout is rebuilt from every span of every trace that resolves to it (`pipelines/silver/identity.py`),
    so a piece of a trace that arrives after others, or names the rollout they did not, moves the
    whole trace and removes the trajectory it was filed under before. A backlog of new spans is read
    in passes of about ``pass_records`` Kafka records (each pass plans, rebuilds and commits its
    watermarks; a rollout with spans in two passes is rebuilt in both), and each pass's rollouts are
    taken ``chunk_rollouts`` at a time, one commit each, so memory follows the pass and the chunk, not
    the backlog. New reward events and idle rollouts go with the last pass. Each commit's
    ``updated_at`` is later than every row committed before it, so the transitions step never misses
    a chunk it has not read yet.
    """
    now = now or dt.datetime.now(dt.UTC)
    res = StepResult()
    spans_table = lake.table("spans")
    if spans_table is None:
        return res
    passes = _span_passes(lake, spans_table, kafka.spans_topic, pass_records)
    ev_cond, ev_txns = _offset_ranges(lake, "rewards", kafka.rewards_topic, "trajectories", "rewards")
    for i, (spans_cond, span_txns) in enumerate(passes):
        last = i == len(passes) - 1
        _one_pass(
            lake,
            spans_table,
            res,
            spans_cond,
            ev_cond if last else None,
            {**span_txns, **(ev_txns if last else {})},
            idle_timeout_s=idle_timeout_s,
            idle=last,
            reward_name=reward_name,
            now=now,
            chunk_rollouts=chunk_rollouts,
        )
    if res.rows:
        res.extra.setdefault("finished", 0)
        res.extra.setdefault("running", 0)
    return res


def _one_pass(
    lake: Lake,
    spans_table: DeltaTable,
    res: StepResult,
    spans_cond: pl.Expr | None,
    ev_cond: pl.Expr | None,
    txns: dict[str, int],
    *,
    idle_timeout_s: float,
    idle: bool,
    reward_name: str | None,
    now: dt.datetime,
    chunk_rollouts: int,
) -> None:
    """Plan, rebuild and commit the rollouts one pass touches (the idle ones too when ``idle``), adding to ``res``."""
    spans = pl.scan_delta(spans_table)  # the snapshot the passes were cut from
    rewards = lake.scan("rewards")
    traj_table = lake.table("trajectories")
    traj = None if traj_table is None else pl.scan_delta(traj_table)
    chain = CommitChain(STEP_MARK, None if traj_table is None else traj_table.transaction_version(STEP_MARK))
    cutoff = now - dt.timedelta(seconds=idle_timeout_s)
    plan = _plan_rollouts(spans, rewards, traj, spans_cond, ev_cond, cutoff if idle else None)
    ids = sorted(plan.rollouts)
    stamp = _next_stamp(traj, now)
    for start in range(0, max(len(ids), 1), chunk_rollouts):
        chunk = ids[start : start + chunk_rollouts]
        last = start + chunk_rollouts >= len(ids)
        if not chunk:
            if txns:
                res.version = lake.write("trajectories", _empty_table("trajectories"), txns=txns, **chain.link())
            break
        rows = keys.keep(_chunk_spans(spans, spans_cond, plan, chunk), chunk, "rollout_id")
        events = empty_rewards()
        if rewards is not None and rows.height:
            events = _events_of(rewards, rows, chunk)
        table = assemble(
            rows, events, now=now, idle_timeout_s=idle_timeout_s, updated_at=stamp, reward_name=reward_name
        )
        stamp += dt.timedelta(microseconds=1)
        kept = zip(table.column("tenant").to_pylist(), table.column("rollout_id").to_pylist(), strict=True)
        removed = sorted(set(chunk) - set(kept))
        res.version = lake.write(
            "trajectories",
            table,
            txns=txns if last else None,
            metadata={REMOVED_KEY: json.dumps([list(r) for r in removed])} if removed else None,
            **_replacing(plan, chunk, table),
            **chain.link(),
        )
        if removed:
            res.extra["removed"] = res.extra.get("removed", 0) + len(removed)
        res.rows += table.num_rows
        res.rollouts += len(chunk) - len(removed)
        status = pc.value_counts(table.column("status")).to_pylist()
        for count in status:
            if count["values"] in ("finished", "running"):
                res.extra[count["values"]] = res.extra.get(count["values"], 0) + count["counts"]
        del rows, events, table  # before the next chunk loads: one chunk in memory at a time


def _chunk_spans(
    spans: pl.LazyFrame, spans_cond: pl.Expr | None, plan: _RolloutPlan, chunk: list[keys.Key]
) -> pl.DataFrame:
    """Every span of the traces ``chunk``'s rollouts are made of, each resolved to its rollout.

    A trace no stored trajectory holds has no span below the pass's offsets: every span already read was
    assembled into the trajectory its trace resolved to, and that trajectory lists the trace. So a trace that
    arrived in this pass and is held by none is read from the pass's offsets alone, which the files' offset
    statistics prune (the cost of the increment); the others are looked up by trace id from their first day.
    """
    traces = sorted({(r[0], t) for r in chunk for t in plan.traces.get(r, ())})
    fresh = [t for t in traces if t in plan.arrived and t not in plan.held]
    older = [t for t in traces if t not in plan.arrived or t in plan.held]
    parts = []
    if fresh and spans_cond is not None:
        parts.append(read_matching(spans, spans_cond & keys.among(fresh, "trace_id"), SPAN_LOCATOR))
    if older:
        load = keys.among(older, "trace_id")
        days = [plan.first_day[t] for t in older if t in plan.first_day]
        if days and len(days) == len(older):
            load = (pl.col("day") >= min(days)) & load
        parts.append(read_matching(spans, load, SPAN_LOCATOR))
    if not parts:
        return resolve_rollouts(spans.clear().collect())
    return resolve_rollouts(keys.keep(pl.concat(parts), traces, "trace_id"))


def _replacing(plan: _RolloutPlan, chunk: list[keys.Key], table: Any) -> dict[str, Any]:
    """How a chunk's rows go in: appended when none of its rollouts has a row yet, else replacing theirs.

    The replacement starts at the oldest day the chunk's stored or new rows have, so delta-rs prunes the
    older days' files (`keys.predicate`); it still reads the rollout ids of every file of those days, the
    cost of the day's traffic. A chunk of rollouts the table has not seen skips that: the step's commit chain
    (``STEP_MARK``) refuses a concurrent run's commit, so an append cannot add a rollout twice.
    """
    if not any(r in plan.stored_day for r in chunk):
        return {"mode": "append"}
    replace = keys.predicate(chunk, "rollout_id")
    if (low := plan.lowest_day(chunk, table.column("day"))) is not None:
        replace = f"day >= '{low.isoformat()}' AND ({replace})"
    return {"mode": "overwrite", "predicate": replace}


def _events_of(rewards: pl.LazyFrame, rows: pl.DataFrame, chunk: list[keys.Key]) -> pl.DataFrame:
    """The reward events that may name a rollout of ``chunk`` (by rollout, trace or response id),
    of the chunk's tenants only; `assemble` matches each within its own tenant."""
    traces = rows["trace_id"].unique().to_list()
    resp = rows["llm_response_id"].drop_nulls().unique().to_list()
    return rewards.filter(
        (pl.col("source") == "event")
        & pl.col("tenant").is_in(sorted({t for t, _ in chunk}))
        & (
            pl.col("rollout_id").is_in(sorted({r for _, r in chunk}))
            | pl.col("trace_id").is_in(traces)
            | pl.col("llm_response_id").is_in(resp)
        )
    ).collect()


@dataclass
class _RolloutPlan:
    """The rollouts to rebuild, the traces each is made of, and a lower bound of each trace's day.

    Rollouts are (tenant, rollout id); a rollout's traces are of its tenant; days are by (tenant, trace id).
    """

    rollouts: set[keys.Key] = field(default_factory=set)
    traces: dict[keys.Key, set[str]] = field(default_factory=dict)
    first_day: dict[keys.Key, dt.date] = field(default_factory=dict)
    # the day of each rollout's row in `trajectories` (None: a row without one); absent: no row yet
    stored_day: dict[keys.Key, dt.date | None] = field(default_factory=dict)
    arrived: set[keys.Key] = field(default_factory=set)  # (tenant, trace id) of the pass's new spans
    held: set[keys.Key] = field(default_factory=set)  # (tenant, trace id) a stored trajectory lists

    def lowest_day(self, chunk: list[keys.Key], new_days: Any) -> dt.date | None:
        """A day no stored or new row of ``chunk`` is older than (None: none known), so that the
        chunk's replacement only looks at those partitions: the cost of the chunk, not of the table."""
        stored = [self.stored_day[r] for r in chunk if r in self.stored_day]
        if any(d is None for d in stored):
            return None
        lows = [d for d in [*stored, pc.min(new_days).as_py()] if d is not None]
        return min(lows) if lows else None

    def add(self, rollout: keys.Key, traces: list[str], day: dt.date | None) -> None:
        self.rollouts.add(rollout)
        self.traces.setdefault(rollout, set()).update(traces)
        if day is not None:
            for t in traces:
                k = (rollout[0], t)
                if k not in self.first_day or day < self.first_day[k]:
                    self.first_day[k] = day


_TOUCHED_COLUMNS = ["tenant", "trace_id", "rollout_id", "day", "llm_response_id", "service_name"]
_GATEWAY = (pl.col("service_name") == A.GATEWAY_SERVICE_NAME).fill_null(False)


def _plan_rollouts(
    spans: pl.LazyFrame,
    rewards: pl.LazyFrame | None,
    traj: pl.LazyFrame | None,
    spans_cond: pl.Expr | None,
    ev_cond: pl.Expr | None,
    cutoff: dt.datetime | None,
) -> _RolloutPlan:
    """Which rollouts a run must rebuild, and from which traces.

    Touched traces are those of new spans, of spans named by new reward events, and of calls that
    share a response id with those (a gateway trace and its client's). A rollout is rebuilt when it
    holds a touched trace, is named by a span of one, was named by a new event or went idle. Every
    match is within one tenant: an event or span never touches another tenant's rollout.
    """
    plan = _RolloutPlan()
    touched: list[pl.DataFrame] = []
    named: set[keys.Key] = set()
    if spans_cond is not None:
        touched.append(spans.filter(spans_cond).select(_TOUCHED_COLUMNS).collect())
        plan.arrived.update(pairs(touched[0], "trace_id"))
    if ev_cond is not None and rewards is not None:
        ev = rewards.filter(ev_cond).select("tenant", "rollout_id", "trace_id", "llm_response_id").collect()
        named.update(pairs(ev, "rollout_id"))
        by_trace, by_resp = pairs(ev, "trace_id"), pairs(ev, "llm_response_id")
        if by_trace or by_resp:
            hit = keys.among(by_trace, "trace_id") | keys.among(by_resp, "llm_response_id")
            found = spans.filter(hit).select(_TOUCHED_COLUMNS).collect()
            touched += [keys.keep(found, by_trace, "trace_id"), keys.keep(found, by_resp, "llm_response_id")]
    if touched:
        found = pl.concat(touched)
        calls = found.filter(pl.col("llm_response_id").is_not_null())
        by_client = pairs(calls.filter(~_GATEWAY), "llm_response_id")
        by_gateway = pairs(calls.filter(_GATEWAY), "llm_response_id")
        if by_client or by_gateway:
            # the gateway's record of a client's call (or the other way round), in another trace;
            # both are recorded within moments of each other
            since = found["day"].min() - dt.timedelta(days=1)  # type: ignore[operator]
            twin = (_GATEWAY & keys.among(by_client, "llm_response_id")) | (
                ~_GATEWAY & keys.among(by_gateway, "llm_response_id")
            )
            twins = spans.filter((pl.col("day") >= since) & twin).select(_TOUCHED_COLUMNS).collect()
            found = pl.concat(
                [
                    found,
                    keys.keep(twins.filter(_GATEWAY), by_client, "llm_response_id"),
                    keys.keep(twins.filter(~_GATEWAY), by_gateway, "llm_response_id"),
                ]
            )
        rollout = pl.coalesce("rollout_id", "trace_id").alias("_r")
        per_trace = found.group_by("tenant", rollout, "trace_id").agg(pl.col("day").min())
        for tenant, rid, tid, day in per_trace.iter_rows():
            plan.add((tenant, rid), [tid], day)
    if traj is not None:
        if cutoff is not None:  # idle rollouts: None leaves them to another pass
            stale = traj.filter((pl.col("status") == "running") & (pl.col("end_time") < cutoff))
            named.update(stale.select("tenant", "rollout_id").collect().iter_rows())
        touched_traces = plan.first_day.keys() | {(r[0], t) for r, ts in plan.traces.items() for t in ts}
        wanted = plan.rollouts | named
        if wanted or touched_traces:
            # every span already in `spans` was assembled into the trajectory its trace resolved to, and
            # a trajectory's day is its earliest span's: so no older partition holds one of its spans
            trace_ids = sorted({t for _, t in touched_traces})
            holds = pl.col("tenant").is_in(sorted({t for t, _ in touched_traces})) & (
                pl.col("trace_ids").list.eval(pl.element().is_in(trace_ids)).list.any()
            )
            old = (
                traj.filter(keys.among(wanted, "rollout_id") | holds)
                .select("tenant", "rollout_id", "trace_ids", "day")
                .collect()
            )
            for tenant, rid, tids, day in old.iter_rows():
                plan.stored_day[(tenant, rid)] = day
                plan.held.update((tenant, t) for t in tids or ())
                if (tenant, rid) in wanted or any((tenant, t) in touched_traces for t in tids or ()):
                    plan.add((tenant, rid), tids or [], day)
    for rk in named - plan.rollouts:
        plan.add(rk, [], None)  # named by an event but never seen: nothing to load, nothing to lose
    if touched:
        _link_twins(plan, found)
    return plan


def _link_twins(plan: _RolloutPlan, found: pl.DataFrame) -> None:
    """Every rollout that holds a trace also loads the traces of its tenant sharing a response id with it."""
    pairs = found.filter(pl.col("llm_response_id").is_not_null()).select("tenant", "llm_response_id", "trace_id")
    pairs = pairs.unique()
    linked = pairs.join(pairs, on=["tenant", "llm_response_id"]).filter(pl.col("trace_id") != pl.col("trace_id_right"))
    if linked.is_empty():
        return
    others: dict[keys.Key, set[str]] = {}
    for tenant, a, b in linked.select("tenant", "trace_id", "trace_id_right").iter_rows():
        others.setdefault((tenant, a), set()).add(b)
    for rk, traces in plan.traces.items():
        tenant = rk[0]
        extra = set().union(*(others.get((tenant, t), set()) for t in traces)) - traces
        if extra:
            days = (plan.first_day[(tenant, t)] for t in traces if (tenant, t) in plan.first_day)
            plan.add(rk, sorted(extra), min(days, default=None))


def _next_stamp(traj: pl.LazyFrame | None, now: dt.datetime) -> dt.datetime:
    """An ``updated_at`` later than every row already committed (and no earlier than ``now``)."""
    if traj is None:
        return now
    newest = traj.select(pl.col("updated_at").max()).collect().item()
    if newest is None or newest < now:
        return now
    return newest + dt.timedelta(microseconds=1)


def _empty_table(name: str) -> Any:
    from schemas.tables import TABLES

    return TABLES[name].empty_table()
