"""Incremental table updates: what each asset does, without Dagster (replay and tests call them too).

Each step reads "what is new" from its source tables using watermarks it stored itself (as Delta
app transactions in its own table), recomputes only the affected rollouts or groups, and replaces
their rows in one commit together with the new watermarks. Rerunning a step after a crash redoes
the same replacement: idempotent, never duplicated.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import polars as pl
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipelines import keys
from pipelines.credit import RunningBaseline, TenantBaselines
from pipelines.identity import resolve_rollouts
from pipelines.ingest import app_id
from pipelines.retokenize import Retokenizer
from pipelines.trajectories import TERMINAL, assemble, empty_rewards
from pipelines.transitions import build, expired, known_at
from schemas import attributes as A
from schemas.config import CreditSettings, KafkaSettings
from schemas.lake import Lake, unseen_offsets
from schemas.tables import CREDIT_METADATA_KEY

TRAJ_FROM_TRANSITIONS = "trajectories.updated_at"
TRAJ_VERSION = "trajectories.version"  # the `trajectories` version the transitions step last read
REMOVED_KEY = "agentlake.removed_rollouts"  # trajectories commit metadata: rollouts deleted by it
BASELINE_KEY = "agentlake.running_baseline"
# The end time (epoch us) before which a finished rollout without a reward had passed the reward horizon
# as of the last transitions run: a run picks up those that passed it since, once each, with no new data.
EXPIRED_UNTIL = "trajectories.expired_until"
G = TypeVar("G")


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
    return unseen_offsets(
        src,
        topic,
        watermark=lambda p: app_id(topic, p),
        seen=lambda p: lake.txn(target, f"{prefix}:{topic}:{p}"),
        seen_app=lambda p: f"{prefix}:{topic}:{p}",
    )


def update_trajectories(
    lake: Lake,
    kafka: KafkaSettings,
    *,
    idle_timeout_s: float,
    reward_name: str | None = None,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
) -> StepResult:
    """Re-assemble every rollout touched by new spans, new reward events or the idle watermark.

    A rollout is rebuilt from every span of every trace that resolves to it (`pipelines/identity.py`),
    so a piece of a trace that arrives after others, or names the rollout they did not, moves the
    whole trace and removes the trajectory it was filed under before. Rollouts are taken
    ``chunk_rollouts`` at a time, one commit each, so memory follows the chunk, not the backlog;
    the watermarks go in with the last chunk. Each commit's ``updated_at`` is later than every row
    committed before it, so the transitions step never misses a chunk it has not read yet.
    """
    now = now or dt.datetime.now(dt.UTC)
    res = StepResult()
    spans_table = lake.table("spans")
    if spans_table is None:
        return res
    spans_cond, span_txns = _offset_ranges(lake, "spans", kafka.spans_topic, "trajectories", "spans")
    ev_cond, ev_txns = _offset_ranges(lake, "rewards", kafka.rewards_topic, "trajectories", "rewards")
    spans = pl.scan_delta(spans_table)  # one snapshot for the whole run
    rewards = lake.scan("rewards")
    traj = lake.scan("trajectories")
    cutoff = now - dt.timedelta(seconds=idle_timeout_s)
    plan = _plan_rollouts(spans, rewards, traj, spans_cond, ev_cond, cutoff)
    txns = {**span_txns, **ev_txns}
    ids = sorted(plan.rollouts)
    stamp = _next_stamp(traj, now)
    for start in range(0, max(len(ids), 1), chunk_rollouts):
        chunk = ids[start : start + chunk_rollouts]
        last = start + chunk_rollouts >= len(ids)
        if not chunk:
            if txns:
                res.version = lake.write("trajectories", _empty("trajectories"), txns=txns)
            break
        traces = sorted({(r[0], t) for r in chunk for t in plan.traces.get(r, ())})
        load = keys.among(traces, "trace_id")
        days = [plan.first_day[t] for t in traces if t in plan.first_day]
        if days and len(days) == len(traces):
            load = (pl.col("day") >= min(days)) & load
        rows = keys.keep(spans.filter(load).collect(engine="streaming"), traces, "trace_id")
        rows = keys.keep(resolve_rollouts(rows), chunk, "rollout_id")
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
            mode="overwrite",
            predicate=keys.predicate(chunk, "rollout_id"),
            metadata={REMOVED_KEY: json.dumps([list(r) for r in removed])} if removed else None,
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
    if res.rows:
        res.extra.setdefault("finished", 0)
        res.extra.setdefault("running", 0)
    return res


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


def _pairs(df: pl.DataFrame, column: str) -> set[keys.Key]:
    """The (tenant, ``column``) pairs of ``df`` where ``column`` is set."""
    return {(t, x) for t, x in df.select("tenant", column).iter_rows() if x}


def _plan_rollouts(
    spans: pl.LazyFrame,
    rewards: pl.LazyFrame | None,
    traj: pl.LazyFrame | None,
    spans_cond: pl.Expr | None,
    ev_cond: pl.Expr | None,
    cutoff: dt.datetime,
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
    if ev_cond is not None and rewards is not None:
        ev = rewards.filter(ev_cond).select("tenant", "rollout_id", "trace_id", "llm_response_id").collect()
        named.update(_pairs(ev, "rollout_id"))
        by_trace, by_resp = _pairs(ev, "trace_id"), _pairs(ev, "llm_response_id")
        if by_trace or by_resp:
            hit = keys.among(by_trace, "trace_id") | keys.among(by_resp, "llm_response_id")
            found = spans.filter(hit).select(_TOUCHED_COLUMNS).collect()
            touched += [keys.keep(found, by_trace, "trace_id"), keys.keep(found, by_resp, "llm_response_id")]
    if touched:
        found = pl.concat(touched)
        calls = found.filter(pl.col("llm_response_id").is_not_null())
        by_client = _pairs(calls.filter(~_GATEWAY), "llm_response_id")
        by_gateway = _pairs(calls.filter(_GATEWAY), "llm_response_id")
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
        pairs = found.group_by("tenant", rollout, "trace_id").agg(pl.col("day").min())
        for tenant, rid, tid, day in pairs.iter_rows():
            plan.add((tenant, rid), [tid], day)
    if traj is not None:
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
    """Recompute the transitions of every group (a task of one tenant) with a changed trajectory.

    Groups are taken in chunks of about ``chunk_rollouts`` changed trajectories, one commit each,
    so memory follows the chunk, not the backlog; the watermark goes in with the last chunk, and a
    crash in between redoes the same replacements. The running baseline carries from chunk to chunk,
    whose groups then go in the order their rollouts' rewards became known. Groups also count as
    changed when a rollout of theirs passed the reward horizon without a reward since the last run
    (`_lapsed`): that is how a rollout is dropped or given the default reward when no data comes.
    """
    now = now or dt.datetime.now(dt.UTC)
    res = StepResult()
    traj_table = lake.table("trajectories")
    if traj_table is None:
        return res
    traj = pl.scan_delta(traj_table)  # one snapshot for the whole run
    mark = lake.txn("transitions", TRAJ_FROM_TRANSITIONS)
    changed = traj
    if mark is not None:
        changed = traj.filter(pl.col("updated_at") > dt.datetime.fromtimestamp(mark / 1e6, dt.UTC))
    group = pl.coalesce("task_id", "rollout_id").alias("group_id")
    # when each rollout's reward became known: the running baseline's order, which the chunks follow
    columns = ["tenant", group, "rollout_id", pl.col("updated_at").dt.epoch("us"), known_at(credit).alias("_known_at")]
    touched = changed.select(columns).collect()
    lapsed, expired_until = _lapsed(traj, credit, now, lake.txn("transitions", EXPIRED_UNTIL))
    if lapsed is not None:
        touched_or_lapsed = pl.concat([touched, lapsed.select(columns).collect()]).unique(keys.ROLLOUT, keep="first")
    else:
        touched_or_lapsed = touched
    # Rollouts the trajectories step removed (their trace joined another rollout), and the groups
    # changed rollouts were filed under before (a task id that arrived late): their old rows must go.
    seen_version = lake.txn("transitions", TRAJ_VERSION)
    removed, removed_any_tenant = _removed_rollouts(traj_table, seen_version)
    sizes = touched_or_lapsed.group_by(keys.GROUP).agg(pl.len(), pl.col("_known_at").min())
    previous = lake.scan("transitions")
    if previous is not None and (removed or removed_any_tenant or touched_or_lapsed.height):
        lookup = _pairs(touched_or_lapsed, "rollout_id") | removed
        ids = sorted({r for _, r in lookup} | removed_any_tenant)
        old = previous.filter(pl.col("rollout_id").is_in(ids)).select(*keys.ROLLOUT, "group_id").unique().collect()
        old = pl.concat(
            [keys.keep(old, lookup, "rollout_id"), old.filter(pl.col("rollout_id").is_in(sorted(removed_any_tenant)))]
        )
        extra = old.select(keys.GROUP).unique().join(sizes, on=keys.GROUP, how="anti")
        extra = extra.with_columns(
            pl.lit(1, pl.UInt32).alias("len"), pl.lit(None, sizes["_known_at"].dtype).alias("_known_at")
        )
        sizes = pl.concat([sizes, extra.select(sizes.columns)])
    if sizes.is_empty():
        return res
    # the running baseline counts rollouts in the order their rewards became known: so do the chunks
    order = ["_known_at", *keys.GROUP] if credit.advantage == "running_baseline" else keys.GROUP
    sizes = sizes.sort(order, nulls_last=False)
    new_mark = int(touched["updated_at"].max()) if touched.height else mark  # type: ignore[arg-type]
    marks = {TRAJ_VERSION: traj_table.version()}
    if new_mark is not None:
        marks[TRAJ_FROM_TRANSITIONS] = new_mark
    if expired_until is not None:
        marks[EXPIRED_UNTIL] = expired_until
    chunks = _group_chunks(list(sizes.select(keys.GROUP).iter_rows()), sizes["len"].to_list(), chunk_rollouts)
    baseline: RunningBaseline | TenantBaselines | None = None
    if credit.advantage == "running_baseline":
        baseline = TenantBaselines.from_json(_saved_baseline(lake))
    dropped: dict[str, int] = {}
    mismatches = defaulted = 0
    reward_sum, rewarded = 0.0, 0
    for i, groups in enumerate(chunks):
        picked = traj.filter(
            pl.col("tenant").is_in(sorted({t for t, _ in groups})) & group.is_in([g for _, g in groups])
        )
        rows = keys.keep(picked.with_columns(group).collect(engine="streaming"), groups, "group_id").drop("group_id")
        known, held = _known_baselines(previous, groups) if baseline is not None else (None, None)
        out = build(
            rows,
            credit,
            now=now,
            retokenizer=retokenizer,
            baseline=baseline,
            known_baselines=known,
            held_baselines=held,
        )
        baseline = out.baseline
        last = i == len(chunks) - 1
        # The baseline goes in with the watermark: a rerun after a crash between chunks starts again
        # from the baseline the watermark belongs to, and counts no rollout twice.
        res.version = lake.write(
            "transitions",
            out.table,
            txns=marks if last else None,
            mode="overwrite",
            predicate=keys.predicate(groups, "group_id"),
            metadata={
                CREDIT_METADATA_KEY: credit.model_dump_json(),  # what a trained version's lineage reports
                **({BASELINE_KEY: baseline.to_json()} if last and baseline is not None else {}),
            },
        )
        res.rows += out.table.num_rows
        res.rollouts += out.rollouts
        defaulted += out.defaulted
        mismatches += out.merge_mismatches
        for reason, n in out.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
        reward = out.table.column("reward")
        reward_sum += float(pc.sum(reward).as_py() or 0.0)
        rewarded += len(reward) - reward.null_count
        del rows, out, reward  # before the next chunk loads: one chunk in memory at a time
    res.extra = {
        "groups": int(sizes.height),
        "commits": len(chunks),
        "merge_mismatches": mismatches,
        **{f"dropped_{k}": v for k, v in sorted(dropped.items())},
    }
    if defaulted:
        res.extra["default_reward_rollouts"] = defaulted
    if rewarded:
        res.extra["reward_mean"] = reward_sum / rewarded
    return res


def _lapsed(
    traj: pl.LazyFrame, credit: CreditSettings, now: dt.datetime, since_us: int | None
) -> tuple[pl.LazyFrame | None, int | None]:
    """Finished rollouts without a reward whose horizon passed since the last run (end time in
    [``since_us``, now - horizon)), and the new mark; (None, None) without a horizon."""
    if not credit.reward_horizon_s:
        return None, None
    cutoff = now - dt.timedelta(seconds=credit.reward_horizon_s)
    cutoff_us = int(cutoff.timestamp() * 1_000_000)
    waiting = (
        pl.col("final_reward").is_null()
        & pl.col("status").is_in(TERMINAL)
        & (pl.col("n_llm_calls") > 0)
        & expired(credit, now)
    )
    if since_us is not None:
        waiting = waiting & (pl.col("end_time") >= dt.datetime.fromtimestamp(since_us / 1e6, dt.UTC))
    return traj.filter(waiting), max(cutoff_us, since_us or cutoff_us)


def horizon_due(lake: Lake, credit: CreditSettings, *, now: dt.datetime | None = None) -> int | None:
    """Whether a transitions run is due with no new data: the new expiry mark (epoch us) when a finished
    rollout without a reward passed its horizon since the last run, else None. For a sensor: run the
    gold step (its run key the mark) and each such rollout is dropped or given the default once."""
    if not credit.reward_horizon_s:  # the default: nothing ever lapses, so no table is opened per sensor tick
        return None
    table = lake.table("trajectories")
    if table is None:
        return None
    since = lake.txn("transitions", EXPIRED_UNTIL)
    lapsed, until = _lapsed(pl.scan_delta(table), credit, now or dt.datetime.now(dt.UTC), since)
    if lapsed is None or not lapsed.select(pl.len()).collect().item():
        return None
    return until


def _known_baselines(
    previous: pl.LazyFrame | None, groups: list[keys.Key]
) -> tuple[dict[keys.Key, float], dict[keys.Key, float]]:
    """The running baseline each rollout of ``groups`` was already compared with, by (tenant, rollout
    id): of those that advanced it (a real reward), and of those that held it (a default reward)."""
    if previous is None:
        return {}, {}
    source = pl.col("reward_source") if "reward_source" in previous.collect_schema().names() else pl.lit(None)
    seen = (
        previous.filter(keys.among(groups, "group_id") & pl.col("baseline").is_not_null())
        .select(*keys.GROUP, "rollout_id", "baseline", (source == "default").fill_null(False).alias("_default"))
        .collect()
    )
    seen = keys.keep(seen, groups, "group_id").unique(keys.ROLLOUT, keep="first")
    known: dict[keys.Key, float] = {}
    held: dict[keys.Key, float] = {}
    for t, r, b, is_default in seen.select(*keys.ROLLOUT, "baseline", "_default").iter_rows():
        (held if is_default else known)[(t, r)] = b
    return known, held


def _removed_rollouts(traj: DeltaTable, after: int | None) -> tuple[set[keys.Key], set[str]]:
    """Rollouts removed by `trajectories` commits newer than version ``after`` (all when None).

    (tenant, rollout id) pairs, and the bare ids that commits from before tenants were keys
    recorded (those may be of any tenant: every tenant's rollout of that id is taken as removed).
    """
    newer = traj.version() - (-1 if after is None else after)
    if newer <= 0:
        return set(), set()
    out: set[keys.Key] = set()
    bare: set[str] = set()
    for commit in traj.history(newer):
        if after is not None and commit.get("version", after + 1) <= after:
            continue
        if REMOVED_KEY in (commit or {}):
            for item in json.loads(commit[REMOVED_KEY]):
                if isinstance(item, str):
                    bare.add(item)
                else:
                    out.add((item[0], item[1]))
    return out, bare


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


def _group_chunks(groups: list[G], sizes: list[int], limit: int) -> list[list[G]]:
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
