"""Reward functions over trajectories (``agentlake.reward_fn``) to `rewards` rows, and back into `trajectories`.

Each function is scored at most once per trajectory row as it stands: per function (its source
``fn:<name>@<version>``) the step keeps a watermark, the newest ``updated_at`` of `trajectories` it
has scored through, as a Delta app transaction of `trajectories`. A new version has none, so it
scores every finished trajectory once; an unchanged one scores only rows re-assembled since. A
``backfill`` ignores the watermarks and scores everything again; rows come out the same (the
reward id is a hash of tenant, rollout, attempt, name and version), and only differences are written.
Choosing another ``[credit] reward`` is a backfill too: every row's ``final_reward`` may change.

The scores are written to `rewards` and attached to the rows of `trajectories` they belong to (their
``rewards`` list and, when ``[credit] reward`` names them, ``final_reward``) in a commit stamped after
every earlier one, so the transitions step rebuilds the affected groups. The rows this step wrote
itself are not scored again: their stamp is kept beside each watermark.

History is re-scored by a new version or a ``backfill`` run, not by day partitions: a trajectory
changes after its day (late spans and rewards re-assemble it), so what needs scoring is "rows this
version has not seen", which a watermark says and a day does not; and the asset stays unpartitioned,
in the same job and automation as the trajectories and transitions around it.

A group reward function (``GroupRewardFunction``, the LLM judge of `pipelines.silver.judging`) scores the
members of a group together, relative to each other: the latest finished attempt of each rollout of
one task (rollouts without a task id: windows of one agent's, by end time), at most ``window`` at a
time. It rides the same watermarks: a group with any member the watermark has not seen is scored again
whole (its relative scores change when it gains a member), and a chunk never splits a group.

This package does not import ``agentlake`` (it sits above us): a reward function is anything with a
``name``, a ``version`` and a ``score(row)`` method, which ``agentlake.reward_fn`` builds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import polars as pl

from pipelines import keys
from pipelines.errors import RewardFunctionError
from pipelines.silver.trajectories import TERMINAL, latest_terminal_attempts
from schemas import attributes as A
from schemas.lake import Lake, in_list
from schemas.tables import REWARDS, TRAJECTORIES

_FN_PREFIX = "fn:"
_CHOICE_APP = "reward_fn:choice"  # a checksum of ``[credit] reward``: when it changes, every row is redone


@runtime_checkable
class RewardFunction(Protocol):
    """What ``agentlake.reward_fn`` builds: an identity and a score of one `trajectories` row."""

    name: str
    version: str

    def score(self, row: Mapping[str, Any]) -> float | None: ...


@runtime_checkable
class GroupRewardFunction(Protocol):
    """A function that scores a group of `trajectories` rows together: one value (or None) per member.

    ``group_by``: ``"task"`` groups rollouts by task id (those without one by agent), ``"agent"`` by
    agent; ``window``: the most members of one group (larger ones are split by end time).
    """

    name: str
    version: str
    group_by: Literal["task", "agent"]
    window: int

    def score_groups(self, groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[float | None]]: ...


AnyRewardFunction = RewardFunction | GroupRewardFunction


def source_of(fn: AnyRewardFunction) -> str:
    return f"{_FN_PREFIX}{fn.name}@{fn.version}"


def load(modules: Iterable[str]) -> list[RewardFunction]:
    """The reward functions ``modules`` define, by name; two of one name are an error."""
    found: dict[str, RewardFunction] = {}
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RewardFunctionError(
                f"[credit] reward_modules: cannot import {module_name!r} ({exc}); is it installed or on PYTHONPATH?"
            ) from exc
        for value in vars(module).values():
            if isinstance(value, RewardFunction) and not isinstance(value, type):
                other = found.get(value.name)
                if other is not None and other is not value:
                    raise RewardFunctionError(f"reward function {value.name!r} is defined twice; rename one")
                found[value.name] = value
    return [found[n] for n in sorted(found)]


def reward_id(tenant: str, rollout_id: str, attempt_id: str | None, source: str) -> str:
    """The same id for the same (attempt, function version): a rerun replaces, never duplicates."""
    text = "\x1f".join([tenant, rollout_id, attempt_id or "", source])
    return source + ":" + hashlib.sha256(text.encode()).hexdigest()[:32]


def scored_rewards(traj: pl.DataFrame, fns: Iterable[RewardFunction]) -> tuple[pl.DataFrame, list[str]]:
    """`rewards` rows of each function over each row of ``traj``, and every id that was scored.

    A function's None is no reward (its id is among the scored ones, so an earlier value is removed).
    """
    records = traj.to_dicts()
    frames, ids = [], []
    for fn in fns:
        frame, fn_ids = _reward_rows(fn, records, [fn.score(row) for row in records])
        frames.append(frame)
        ids += fn_ids
    return (pl.concat(frames) if frames else _empty_rewards()), ids


def _empty_rewards() -> pl.DataFrame:
    empty = pl.from_arrow(REWARDS.empty_table())
    assert isinstance(empty, pl.DataFrame)
    return empty


def _reward_rows(
    fn: AnyRewardFunction, records: Sequence[Mapping[str, Any]], values: Sequence[float | None]
) -> tuple[pl.DataFrame, list[str]]:
    """The `rewards` rows of ``fn``'s ``values`` for ``records`` (None: none), and the ids of all of them."""
    source = source_of(fn)
    rows: list[dict[str, Any]] = []
    ids: list[str] = []
    for row, value in zip(records, values, strict=True):
        rid = reward_id(row["tenant"], row["rollout_id"], row["attempt_id"], source)
        ids.append(rid)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardFunctionError(
                f"reward function {fn.name}@{fn.version} returned {value!r} for rollout {row['rollout_id']!r}"
                f" (tenant {row['tenant']!r}); return a finite number or None"
            )
        rows.append(
            {
                "reward_id": rid,
                "source": source,
                "tenant": row["tenant"],
                "rollout_id": row["rollout_id"],
                "attempt_id": row["attempt_id"],
                "trace_id": (row["trace_ids"] or [None])[0],
                "name": fn.name,
                "value": float(value),
                "event_time": row["end_time"] or row["start_time"],
                "day": row["day"],
            }
        )
    empty = _empty_rewards()
    out = pl.DataFrame(rows, schema={k: empty.schema[k] for k in rows[0]}) if rows else empty
    return pl.concat([empty, out], how="diagonal").select(empty.columns), ids


_GROUP_INDEX = ["tenant", "rollout_id", "attempt_id", "task_id", "agents", "status", "end_time", "updated_at"]


def group_members(index: pl.DataFrame, *, group_by: Literal["task", "agent"], window: int) -> pl.DataFrame:
    """The group of each rollout's latest finished attempt in ``index`` (`trajectories` rows).

    Columns: the attempt's keys, ``group`` (``task:<id>#<n>`` or ``agent:<name>#<n>``, with the tenant a
    key beside it) and ``position`` in it. A sequence (one tenant's rollouts of one task, or of one
    agent) is ordered by end time and cut into windows of ``window``; a window is a group.
    """
    latest, _ = latest_terminal_attempts(index)
    by_task = pl.col("task_id").is_not_null() if group_by == "task" else pl.lit(False)
    agent = pl.col("agents").list.first().fill_null("")
    seq = pl.when(by_task).then(pl.lit("task:") + pl.col("task_id")).otherwise(pl.lit("agent:") + agent)
    ranked = (
        latest.with_columns(seq.alias("_seq"))
        .sort("tenant", "_seq", "end_time", "rollout_id", nulls_last=False)
        .with_columns(pl.int_range(pl.len()).over("tenant", "_seq").alias("_n"))
    )
    return ranked.select(
        *keys.ATTEMPT,
        (pl.col("_seq") + "#" + (pl.col("_n") // window).cast(pl.String)).alias("group"),
        (pl.col("_n") % window).alias("position"),
        *([c for c in ("_wanted",) if c in index.columns]),
    )


def affected_groups(members: pl.DataFrame) -> pl.DataFrame:
    """The members of every group that must be scored again: those holding a ``_wanted`` row, and the
    later windows of the same sequence (a member that ended earlier than others shifts them all)."""
    parts = pl.col("group").str.split("#")
    seqs = members.with_columns(
        parts.list.first().alias("_seq"), parts.list.last().cast(pl.Int64).alias("_w")
    ).with_columns(pl.col("_w").filter(pl.col("_wanted")).min().over("tenant", "_seq").alias("_first"))
    return seqs.filter(pl.col("_w") >= pl.col("_first")).drop("_seq", "_w", "_first", "_wanted")


def group_rewards(
    viewed: pl.DataFrame, fn: GroupRewardFunction, members: pl.DataFrame
) -> tuple[pl.DataFrame, list[str]]:
    """`rewards` rows of ``fn`` over the groups in ``members``, and every id scored: every attempt of
    each member's rollout (an attempt superseded by a later one loses its reward)."""
    placed = viewed.join(
        members.select(*keys.ATTEMPT, "group", "position"), on=keys.ATTEMPT, how="left", nulls_equal=True
    )
    mine = keys.keep(placed, members.select(*keys.ROLLOUT).iter_rows(), "rollout_id")
    in_groups = mine.filter(pl.col("group").is_not_null()).sort("tenant", "group", "position")
    groups = [
        g.drop("group", "position").to_dicts() for _, g in in_groups.group_by("tenant", "group", maintain_order=True)
    ]
    scores = fn.score_groups(groups) if groups else []
    if len(scores) != len(groups) or any(len(s) != len(g) for s, g in zip(scores, groups, strict=False)):
        raise RewardFunctionError(
            f"group reward function {fn.name}@{fn.version} returned other than one score per member"
        )
    records = [row for g in groups for row in g]
    values = [v for s in scores for v in s]
    others = mine.filter(pl.col("group").is_null()).drop("group", "position").to_dicts()
    frame, ids = _reward_rows(fn, [*records, *others], [*values, *([None] * len(others))])
    return frame, ids


def unit_chunks(units: Iterable[set[keys.Key]], size: int) -> list[list[keys.Key]]:
    """Rollouts in chunks of about ``size``; the rollouts of one unit (a group) always share a chunk.

    Units that share a rollout are merged first (two group functions may group differently).
    """
    parent: dict[keys.Key, keys.Key] = {}

    def root(k: keys.Key) -> keys.Key:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    for unit in units:
        first, *rest = sorted(unit)
        for k in rest:
            parent[root(k)] = root(first)
        root(first)
    merged: dict[keys.Key, list[keys.Key]] = {}
    for k in sorted(parent):
        merged.setdefault(root(k), []).append(k)
    out: list[list[keys.Key]] = []
    for unit_keys in sorted(merged.values()):
        if not out or len(out[-1]) + len(unit_keys) > size and out[-1]:
            out.append([])
        out[-1].extend(unit_keys)
    return [sorted(c) for c in out if c]


_SPAN_VIEW = ["span_id", "parent_span_id", "name", "start_time", "end_time", "status_code", "attributes"]


def with_spans(traj: pl.DataFrame, spans: pl.LazyFrame | None) -> pl.DataFrame:
    """``traj`` with a ``spans`` column: the spans of each row's traces and attempt (attributes as JSON text).

    Read from `spans` by (tenant, trace id), from the rows' first day on (a trajectory's day is its
    earliest span's); a span without an attempt id belongs to every attempt of its trace.
    """
    pairs = {(t, x) for t, ids in traj.select("tenant", "trace_ids").iter_rows() for x in ids or ()}
    if spans is None or not pairs:
        return traj.with_columns(pl.lit(None, pl.List(pl.Struct({c: pl.String for c in _SPAN_VIEW}))).alias("spans"))
    found = keys.keep(
        spans.filter((pl.col("day") >= traj["day"].min()) & keys.among(pairs, "trace_id"))
        .select("tenant", "trace_id", "attempt_id", *_SPAN_VIEW)
        .collect(),
        pairs,
        "trace_id",
    )
    per_row = (
        traj.select(*keys.ATTEMPT, "trace_ids")
        .with_row_index("_row")
        .explode("trace_ids")
        .rename({"trace_ids": "trace_id"})
        .join(found.rename({"attempt_id": "_span_attempt"}), on=["tenant", "trace_id"])
        .filter(pl.col("_span_attempt").is_null() | (pl.col("_span_attempt") == pl.col("attempt_id")))
        .sort("start_time", "span_id")
        .group_by("_row")
        .agg(pl.struct(_SPAN_VIEW).alias("spans"))
    )
    return traj.with_row_index("_row").join(per_row, on="_row", how="left").sort("_row").drop("_row")


def final_reward(entries: list[dict[str, Any]], chosen: str | None) -> float | None:
    """The reward named ``chosen`` (the last one), else `assemble`'s rule: the last primary, else the first."""
    for name in (chosen, A.PRIMARY_REWARD_NAME):
        named = [e["value"] for e in entries if name is not None and e["name"] == name]
        if named:
            return named[-1]
    return entries[0]["value"] if entries else None


def attach(traj: pl.DataFrame, fn_rewards: pl.DataFrame, *, chosen: str | None) -> pl.DataFrame:
    """``traj`` rows with their function rewards replaced by ``fn_rewards`` and ``final_reward`` recomputed."""
    by_attempt: dict[tuple[str, str, str | None], list[dict[str, Any]]] = {}
    for r in fn_rewards.sort("reward_id").to_dicts():
        entry = {k: r[k] for k in ("reward_id", "name", "value", "source", "span_id", "event_time")}
        by_attempt.setdefault((r["tenant"], r["rollout_id"], r["attempt_id"]), []).append(entry)
    lists, finals = [], []
    for row in traj.to_dicts():
        kept = [e for e in row["rewards"] or [] if not (e["source"] or "").startswith(_FN_PREFIX)]
        entries = kept + by_attempt.get((row["tenant"], row["rollout_id"], row["attempt_id"]), [])
        lists.append(entries)
        finals.append(final_reward(entries, chosen))
    return traj.with_columns(
        pl.Series("rewards", lists, dtype=traj.schema["rewards"]),
        pl.Series("final_reward", finals, dtype=pl.Float64),
    )


def _mark_app(source: str) -> str:
    return f"reward_fn:{source}"


def _own_app(source: str) -> str:
    return f"reward_fn:{source}:own"


def _us(t: dt.datetime) -> int:
    return int(t.timestamp() * 1_000_000)


@dataclass
class ScoreResult:
    scored: dict[str, int] = field(default_factory=dict)  # source -> trajectory rows scored
    rewards_written: int = 0
    rewards_removed: int = 0
    rollouts_updated: int = 0
    version: int | None = None

    def metadata(self) -> dict[str, Any]:
        return {
            "scored": sum(self.scored.values()),
            "rewards_written": self.rewards_written,
            "rewards_removed": self.rewards_removed,
            "rollouts_updated": self.rollouts_updated,
            "delta_version": self.version or 0,
        }


def score_trajectories(
    lake: Lake,
    fns: Sequence[AnyRewardFunction],
    *,
    chosen: str | None = None,
    backfill: bool = False,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
) -> ScoreResult:
    """Score the finished trajectories each function has not scored yet (all with ``backfill``).

    Rollouts are taken ``chunk_rollouts`` at a time (a group whole, whatever its size), one `rewards`
    and one `trajectories` commit each, so memory and the commits' predicates follow the chunk; the
    watermarks go in with the last chunk, and a crash in between redoes the chunks already written,
    finding nothing to change there.
    """
    res = ScoreResult()
    if not fns:  # none named in settings (the default): nothing to read
        return res
    traj_dt = lake.pin("trajectories") if lake.table("trajectories") is not None else None
    if traj_dt is None:
        return res
    sources = [source_of(f) for f in fns]
    choice = zlib.crc32((chosen or "").encode())
    was = traj_dt.transaction_version(_CHOICE_APP)
    backfill = backfill or (was is not None and was != choice)  # another final reward: every row again
    marks = {s: None if backfill else traj_dt.transaction_version(_mark_app(s)) for s in sources}
    owns = {s: traj_dt.transaction_version(_own_app(s)) for s in sources}
    newest = pl.scan_delta(traj_dt).select(pl.col("updated_at").max()).collect().item()
    if newest is None:
        return res
    done = pl.col("status").is_in(TERMINAL)
    us = pl.col("updated_at").dt.epoch("us")
    wanted = {
        s: done if marks[s] is None else done & (us > marks[s]) & (pl.lit(True) if owns[s] is None else us != owns[s])
        for s in sources
    }
    singles = [s for f, s in zip(fns, sources, strict=True) if not isinstance(f, GroupRewardFunction)]
    units: list[set[keys.Key]] = []
    if singles:
        anyone = pl.any_horizontal(*(wanted[s] for s in singles))
        units += [{k} for k in pl.scan_delta(traj_dt).filter(anyone).select(*keys.ROLLOUT).collect().iter_rows()]
    members: dict[str, pl.DataFrame] = {}  # a group function's source -> the members of the groups it scores
    for fn, s in zip(fns, sources, strict=True):
        if isinstance(fn, GroupRewardFunction):
            index = (
                pl.scan_delta(traj_dt)
                .filter(done)
                .select(*_GROUP_INDEX, wanted[s].alias("_wanted"))
                .with_columns(pl.col("_wanted").any().over(keys.ROLLOUT))
                .collect()
            )
            members[s] = affected_groups(group_members(index, group_by=fn.group_by, window=fn.window))
            for _, g in members[s].group_by("tenant", "group"):
                units.append(set(g.select(*keys.ROLLOUT).iter_rows()))
    chunks = unit_chunks(units, chunk_rollouts)
    if not chunks:
        return res
    stamp = max(newest + dt.timedelta(microseconds=1), now or dt.datetime.now(dt.UTC))
    for n, chunk in enumerate(chunks, start=1):
        rows = keys.keep(pl.scan_delta(traj_dt).filter(keys.among(chunk, "rollout_id")).collect(), chunk, "rollout_id")
        fresh, ids = [], []
        viewed = with_spans(rows, lake.scan("spans"))
        for fn, s in zip(fns, sources, strict=True):
            if isinstance(fn, GroupRewardFunction):
                mine = keys.keep(members[s], chunk, "rollout_id")
                res.scored[s] = res.scored.get(s, 0) + mine.height
                scored, scored_ids = group_rewards(viewed, fn, mine)
            else:
                subset = viewed.filter(wanted[s])
                res.scored[s] = res.scored.get(s, 0) + subset.height
                scored, scored_ids = scored_rewards(subset, [fn])
            fresh.append(scored)
            ids += scored_ids
        _write_rewards(lake, pl.concat(fresh), ids, res)
        _attach_chunk(lake, traj_dt, rows, chunk, sources, chosen=chosen, stamp=stamp, res=res)
        if n == len(chunks):  # the last chunk: the watermarks go in with it
            new_marks = {_mark_app(s): _us(newest) for s in sources} | {_CHOICE_APP: choice}
            if res.rollouts_updated:
                new_marks |= {_own_app(s): _us(stamp) for s in sources}
            res.version = lake.write(
                "trajectories", TRAJECTORIES.empty_table(), mode="append", snapshot=traj_dt, marks=new_marks
            )
    return res


def _attach_chunk(
    lake: Lake,
    traj_dt: Any,
    rows: pl.DataFrame,
    chunk: list[keys.Key],
    sources: list[str],
    *,
    chosen: str | None,
    stamp: dt.datetime,
    res: ScoreResult,
) -> None:
    """Attach every current function's rewards to the chunk's rows; rewrite those that changed, stamped later."""
    current = lake.scan("rewards")
    if current is None:
        return
    found = current.filter(pl.col("source").is_in(sources) & keys.among(chunk, "rollout_id")).collect()
    after = attach(rows, keys.keep(found, chunk, "rollout_id"), chosen=chosen)
    changed = _changed_rollouts(rows, after)
    if not changed:
        return
    rewrite = keys.keep(after, changed, "rollout_id").with_columns(
        pl.lit(stamp).dt.cast_time_unit("us").dt.replace_time_zone("UTC").alias("updated_at")
    )
    lake.write(
        "trajectories",
        rewrite.to_arrow().cast(TRAJECTORIES),
        mode="overwrite",
        predicate=keys.predicate(changed, "rollout_id"),
        snapshot=traj_dt,
    )
    res.rollouts_updated += len(changed)


def _write_rewards(lake: Lake, fresh: pl.DataFrame, ids: list[str], res: ScoreResult) -> None:
    """Replace the scored ids' rows in `rewards` where they differ: new, changed or gone (None now)."""
    table = lake.scan("rewards")
    old = pl.DataFrame(schema={"reward_id": pl.String, "value": pl.Float64})
    if table is not None and ids:
        old = table.filter(pl.col("reward_id").is_in(ids)).select("reward_id", "value").collect()
    was = dict(old.iter_rows())
    now = dict(fresh.select("reward_id", "value").iter_rows())
    differ = sorted({i for i in now if was.get(i) != now[i]} | {i for i in was if i not in now})
    if not differ:
        return
    rows = fresh.filter(pl.col("reward_id").is_in(differ))
    lake.write(
        "rewards",
        rows.to_arrow(),
        mode="overwrite" if table is not None else "append",
        predicate=in_list("reward_id", differ) if table is not None else None,
    )
    res.rewards_written += rows.height
    res.rewards_removed += sum(1 for i in was if i not in now)


def _changed_rollouts(before: pl.DataFrame, after: pl.DataFrame) -> list[keys.Key]:
    """The rollouts any of whose rows got other rewards or another final reward."""
    cols = [*keys.ATTEMPT, "rewards", "final_reward"]
    b = before.select(cols).to_dicts()
    a = after.select(cols).to_dicts()
    return sorted({(x["tenant"], x["rollout_id"]) for x, y in zip(b, a, strict=True) if x != y})
