"""The gold step: recompute the transitions of every group with a changed trajectory.

Incremental as `pipelines.steps` says: the `trajectories` version and ``updated_at`` it has read,
the reward-horizon mark and the running baseline go into `transitions` with the rows.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import polars as pl
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipelines import keys
from pipelines.gold.baselines import RunningBaseline, TenantBaselines
from pipelines.gold.estimators import is_stateful
from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.reward_horizon import EXPIRED_UNTIL, known_at, lapsed
from pipelines.gold.token_check import STATUSES, TOKEN_STATUS_PREFIX
from pipelines.gold.transitions import build
from pipelines.silver.trajectories_step import REMOVED_KEY
from pipelines.steps import CommitChain, StepResult, group_chunks, pairs
from schemas.config import CreditSettings
from schemas.lake import Lake, read_matching
from schemas.tables import CREDIT_METADATA_KEY

TRAJ_FROM_TRANSITIONS = "trajectories.updated_at"
TRAJ_VERSION = "trajectories.version"  # the `trajectories` version the transitions step last read
BASELINE_KEY = "agentlake.running_baseline"
# This step's commit chain (`pipelines.steps.CommitChain`): two runs at once cannot both commit, so groups the
# table holds no rows of yet are appended, not replaced (a replacement reads the group ids of every file of its days).
STEP_MARK = "transitions:step"


def update_transitions(
    lake: Lake,
    credit: CreditSettings,
    *,
    retokenizer: Retokenizer | Callable[[], Retokenizer | None] | None = None,
    verifier: Callable[[Any, Any], list[int] | None] | None = None,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
) -> StepResult:
    """Recompute the transitions of every group (a task of one tenant) with a changed trajectory.

    Groups are taken in chunks of about ``chunk_rollouts`` changed trajectories, one commit each,
    so memory follows the chunk, not the backlog; the watermark goes in with the last chunk, and a
    crash in between redoes the same replacements. The running baseline carries from chunk to chunk,
    whose groups then go in the order their rollouts' rewards became known. Groups also count as
    changed when a rollout of theirs passed the reward horizon without a reward since the last run
    (`pipelines.gold.reward_horizon.lapsed`): that is how a rollout is dropped or given the default reward
    when no data comes.
    """
    now = now or dt.datetime.now(dt.UTC)
    res = StepResult()
    traj_table = lake.table("trajectories")
    if traj_table is None:
        return res
    traj = pl.scan_delta(traj_table)  # one snapshot for the whole run
    trans_table = lake.table("transitions")  # and one of its own: positions, the chain, the stored rows
    mark = _txn(trans_table, TRAJ_FROM_TRANSITIONS)
    chain = CommitChain(STEP_MARK, _txn(trans_table, STEP_MARK))
    changed = traj
    if mark is not None:
        changed = traj.filter(pl.col("updated_at") > dt.datetime.fromtimestamp(mark / 1e6, dt.UTC))
    group = pl.coalesce("task_id", "rollout_id").alias("group_id")
    # when each rollout's reward became known: the running baseline's order, which the chunks follow
    columns = ["tenant", group, "rollout_id", pl.col("updated_at").dt.epoch("us"), known_at(credit).alias("_known_at")]
    touched = changed.select(columns).collect()
    lapsed_rows, expired_until = lapsed(traj, credit, now, _txn(trans_table, EXPIRED_UNTIL))
    if lapsed_rows is not None:
        late = lapsed_rows.select(columns).collect()
        touched_or_lapsed = pl.concat([touched, late]).unique(keys.ROLLOUT, keep="first")
    else:
        touched_or_lapsed = touched
    # Rollouts the trajectories step removed (their trace joined another rollout), and the groups
    # changed rollouts were filed under before (a task id that arrived late): their old rows must go.
    seen_version = _txn(trans_table, TRAJ_VERSION)
    removed, removed_any_tenant = removed_rollouts(traj_table, seen_version)
    sizes = touched_or_lapsed.group_by(keys.GROUP).agg(pl.len(), pl.col("_known_at").min())
    previous = None if trans_table is None else pl.scan_delta(trans_table)
    if previous is not None and (removed or removed_any_tenant or touched_or_lapsed.height):
        lookup = pairs(touched_or_lapsed, "rollout_id") | removed
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
    order = ["_known_at", *keys.GROUP] if is_stateful(credit.advantage) else keys.GROUP
    sizes = sizes.sort(order, nulls_last=False)
    new_mark = int(touched["updated_at"].max()) if touched.height else mark  # type: ignore[arg-type]
    marks = {TRAJ_VERSION: traj_table.version()}
    if new_mark is not None:
        marks[TRAJ_FROM_TRANSITIONS] = new_mark
    if expired_until is not None:
        marks[EXPIRED_UNTIL] = expired_until
    chunks = group_chunks(list(sizes.select(keys.GROUP).iter_rows()), sizes["len"].to_list(), chunk_rollouts)
    baseline: RunningBaseline | TenantBaselines | None = None
    if is_stateful(credit.advantage):
        baseline = TenantBaselines.from_json(saved_baseline(lake, trans_table))
    dropped: dict[str, int] = {}
    mismatches = defaulted = 0
    token_status: Counter[str] = Counter()
    merge_breaks: Counter[str] = Counter()
    reward_sum, rewarded = 0.0, 0
    for i, groups in enumerate(chunks):
        picked = pl.col("tenant").is_in(sorted({t for t, _ in groups})) & group.is_in([g for _, g in groups])
        # the key columns first, then whole rows only from the files that hold the chunk's (each chunk
        # commit of the trajectories step stamps its rows with one updated_at)
        rows = read_matching(traj, picked, ["updated_at"])
        rows = keys.keep(rows.with_columns(group), groups, "group_id").drop("group_id")
        known, held = _known_baselines(previous, groups) if baseline is not None else (None, None)
        out = build(
            rows,
            credit,
            now=now,
            retokenizer=retokenizer,
            verifier=verifier,
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
            metadata={
                CREDIT_METADATA_KEY: credit.model_dump_json(),  # what a trained version's lineage reports
                **({BASELINE_KEY: baseline.to_json()} if last and baseline is not None else {}),
            },
            **_replacing(previous, groups, out.table),
            **chain.link(),
        )
        res.rows += out.table.num_rows
        res.rollouts += out.rollouts
        defaulted += out.defaulted
        mismatches += out.merge_mismatches
        token_status.update(out.token_status)
        merge_breaks.update(out.merge_breaks)
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
        # calls by how their tokens are known (the transitions asset check reads the mismatch rate)
        **{f"{TOKEN_STATUS_PREFIX}{s}": token_status.get(s, 0) for s in STATUSES},
        **{f"merge_break_{k}": v for k, v in sorted(merge_breaks.items())},
    }
    if defaulted:
        res.extra["default_reward_rollouts"] = defaulted
    if rewarded:
        res.extra["reward_mean"] = reward_sum / rewarded
    return res


def _txn(table: DeltaTable | None, app_id: str) -> int | None:
    return None if table is None else table.transaction_version(app_id)


def _replacing(previous: pl.LazyFrame | None, groups: list[keys.Key], new: Any) -> dict[str, Any]:
    """How a chunk's rows of ``groups`` go in: appended when the table holds none of those groups' rows,
    else replacing them with a Delta predicate. It starts at the oldest day the stored or new rows have,
    so older partitions stay unread (delta-rs reads the group ids of every file it cannot prune by
    partition): the cost of the chunk and its days, not of the table. The append skips even that; the
    step's commit chain (``STEP_MARK``) refuses a concurrent run's commit, so no group lands twice."""
    replace = keys.predicate(groups, "group_id")
    days = [pc.min(new.column("day")).as_py() if new.num_rows else None]
    if previous is not None:
        stored = previous.filter(keys.among(groups, "group_id")).select(*keys.GROUP, "day").unique().collect()
        stored = keys.keep(stored, groups, "group_id")
        if stored.is_empty():
            return {"mode": "append"}
        if stored["day"].null_count():
            return {"mode": "overwrite", "predicate": replace}
        days.append(stored["day"].min())
    else:
        return {"mode": "append"}
    if (low := min((d for d in days if d is not None), default=None)) is not None:
        replace = f"day >= '{low.isoformat()}' AND ({replace})"
    return {"mode": "overwrite", "predicate": replace}


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


def removed_rollouts(traj: DeltaTable, after: int | None) -> tuple[set[keys.Key], set[str]]:
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


def saved_baseline(lake: Lake, table: DeltaTable | None = None) -> str | None:
    """The running baseline of the newest `transitions` commit that carries one (of ``table``, a snapshot
    of the lake's `transitions`, when given).

    Not simply the newest commit's: chunk commits before the last one and compaction commits carry
    none, and reading those as "no baseline" would start it over.
    """
    table = lake.table("transitions") if table is None else table
    if table is None:
        return None

    def newest_first() -> Iterator[dict[str, Any]]:
        recent = table.history(64)  # almost always holds it; the whole log is read only when not
        yield from recent
        if len(recent) == 64:
            yield from table.history()[64:]

    return next((c[BASELINE_KEY] for c in newest_first() if BASELINE_KEY in (c or {})), None)
