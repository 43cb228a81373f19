"""What the versions pages show: the registry's versions, one version's lineage, what it trained on, how it scored.

`model_versions` and `evaluations` are about the shared policy, not one tenant's rows, so every scope sees
them; what a version trained on (`training_lineage`) and the rewards of the rollouts it sampled
(`trajectories`) are tenant rows, so a tenant sees only its own. A lineage row names no tenant, but its
transition id does (``pipelines.keys.transition_id``: ``@<tenant>`` after the step for every tenant but the
default), so scoping it needs no join with `transitions`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl

from schemas.topics import DEFAULT_TENANT
from viewer.auth import Scope
from viewer.lake import ViewerLake
from viewer.queries import REGISTRY_VERSIONS_SQL
from viewer.queries.filters import invalid, page_number

PER_PAGE = 50
STATUSES = ("pending", "published", "failed", "rejected", "rolled_back")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_AGENT = re.compile(r"[^\x00-\x1f]{1,128}")

# The tenant of a lineage row, read back from its transition id: the escaped tenant after the last "@" of the
# id's last "/" part (pipelines.keys escapes %, / and @ in it), the default tenant when there is none.
LINEAGE_TENANT = (
    "CASE WHEN regexp_matches(l.transition_id, '@[^/@]*$') "
    "THEN replace(replace(replace(regexp_extract(l.transition_id, '@([^/@]*)$', 1), '%2F', '/'), '%40', '@'), "
    "'%25', '%') "
    f"ELSE '{DEFAULT_TENANT}' END"
)


def version_name(raw: str) -> str:
    """A version name as the URL gives it; a 400 (``BadRequest``) for one no registry could hold."""
    if not _VERSION.fullmatch(raw):
        raise invalid("version", raw, "a version name: letters, digits, '.', '_' or '-' (e.g. v0007)")
    return raw


@dataclass(frozen=True)
class VersionsFilter:
    """The /versions list's query: which line and publish status, which page."""

    agent: str | None = None
    status: str | None = None
    page: int = 1

    @classmethod
    def parse(cls, params: dict[str, str]) -> VersionsFilter:
        """From the query string; a 400 (``BadRequest``) names the parameter and what it takes."""
        agent = params.get("agent") or None
        if agent is not None and not _AGENT.fullmatch(agent):
            raise invalid("agent", agent, "an agent name of 1 to 128 printable characters")
        status = params.get("status") or None
        if status is not None and status not in STATUSES:
            raise invalid("status", status, f"one of {', '.join(STATUSES)}")
        return cls(agent=agent, status=status, page=page_number(params.get("page")))


def list_versions(lake: ViewerLake, scope: Scope, f: VersionsFilter) -> tuple[pl.DataFrame, int]:
    """One page of versions, newest first, each with its latest evaluation; and how many match in all."""
    del scope  # versions are the shared policy's: every scope sees them (see the module doc)
    where = "($agent IS NULL OR v.agent = $agent) AND ($status IS NULL OR v.publish_status = $status)"
    params: dict[str, Any] = {"agent": f.agent, "status": f.status}
    total = lake.frame(f"SELECT count(*) AS n FROM model_versions v WHERE {where}", params).item()
    rows = lake.frame(
        f"""
        SELECT v.version, v.version_number, v.parent_version, v.agent, v.kind, v.publish_status,
               v.created_at, v.published_at, v.n_transitions, v.tracking_url,
               e.mean AS eval_mean, e.ci_low AS eval_low, e.ci_high AS eval_high, e.confidence AS eval_confidence,
               e.verdict AS eval_verdict
        FROM model_versions v
        LEFT JOIN (
            SELECT * FROM evaluations
            QUALIFY row_number() OVER (PARTITION BY version, agent ORDER BY evaluated_at DESC) = 1
        ) e ON e.version = v.version AND e.agent IS NOT DISTINCT FROM v.agent
        WHERE {where}
        ORDER BY v.created_at DESC, v.version_number DESC
        LIMIT $limit OFFSET $offset
        """,
        {**params, "limit": PER_PAGE, "offset": (f.page - 1) * PER_PAGE},
    )
    return rows, int(total)


def agents(lake: ViewerLake) -> list[str]:
    """The policy lines the registry holds (for the filter's choices)."""
    frame = lake.frame("SELECT DISTINCT agent FROM model_versions WHERE agent IS NOT NULL ORDER BY 1")
    return [str(a) for a in frame["agent"]]


@dataclass(frozen=True)
class VersionDetail:
    """One version: its registry row, its line's ancestors and descendants, evaluations and training data."""

    row: dict[str, Any]
    ancestors: list[dict[str, Any]]  # parent first, then its parent, ...
    descendants: list[dict[str, Any]]  # the versions trained from it, and from those, oldest first
    evaluations: pl.DataFrame  # newest first
    rollouts: pl.DataFrame  # one page of the rollouts it trained on, the scope's only
    n_rollouts: int  # in all, the scope's only
    n_transitions: int  # lineage rows, the scope's only
    page: int


def version_detail(lake: ViewerLake, scope: Scope, version: str, *, page: int = 1) -> VersionDetail | None:
    """Everything /versions/{version} shows; None when the registry has no such version."""
    family = lake.frame(
        "SELECT version, version_number, parent_version, agent, publish_status, created_at FROM model_versions"
    )
    by_name = {r["version"]: r for r in family.iter_rows(named=True)}
    if version not in by_name:
        return None
    row = lake.frame("SELECT * FROM model_versions WHERE version = $v", {"v": version}).row(0, named=True)
    ancestors: list[dict[str, Any]] = []
    name = row["parent_version"]
    while name is not None and name in by_name and len(ancestors) < len(by_name):
        ancestors.append(by_name[name])
        name = by_name[name]["parent_version"]
    children: dict[str, list[dict[str, Any]]] = {}
    for r in by_name.values():
        if r["parent_version"] is not None:
            children.setdefault(r["parent_version"], []).append(r)
    descendants: list[dict[str, Any]] = []
    todo, seen = [version], {version}
    while todo:
        for child in children.get(todo.pop(), []):
            if child["version"] not in seen:
                seen.add(child["version"])
                descendants.append(child)
                todo.append(child["version"])
    descendants.sort(key=lambda r: (r["created_at"], r["version_number"]))
    evaluations = lake.frame(
        "SELECT * FROM evaluations WHERE version = $v ORDER BY evaluated_at DESC, task_set", {"v": version}
    )
    cond, tparams = _tenant_condition(scope)
    lineage = f"""
        SELECT l.rollout_id, l.transition_id, l.train_table, l.consumed_at, {LINEAGE_TENANT} AS tenant
        FROM training_lineage l WHERE l.model_version = $v
    """
    params = {"v": version, **tparams}
    counts = lake.frame(
        f"SELECT count(*) AS transitions, count(DISTINCT (tenant, rollout_id)) AS rollouts "
        f"FROM ({lineage}) WHERE {cond}",
        params,
    ).row(0, named=True)
    rollouts = lake.frame(
        f"""
        WITH l AS (SELECT * FROM ({lineage}) WHERE {cond}),
        r AS (
            SELECT tenant, rollout_id, count(*) AS transitions, min(consumed_at) AS consumed_at,
                   any_value(train_table) AS train_table
            FROM l GROUP BY tenant, rollout_id
            ORDER BY rollout_id, tenant LIMIT $limit OFFSET $offset
        )
        SELECT r.*, t.task_id, t.status, t.final_reward, t.agents, t.end_time
        FROM r LEFT JOIN (
            SELECT tenant, rollout_id, task_id, status, final_reward, agents, end_time FROM trajectories
            WHERE rollout_id IN (SELECT rollout_id FROM r)
            QUALIFY row_number() OVER (PARTITION BY tenant, rollout_id ORDER BY updated_at DESC) = 1
        ) t ON t.tenant = r.tenant AND t.rollout_id = r.rollout_id
        ORDER BY r.rollout_id, r.tenant
        """,
        {**params, "limit": PER_PAGE, "offset": (page - 1) * PER_PAGE},
    )
    return VersionDetail(
        row=row,
        ancestors=ancestors,
        descendants=descendants,
        evaluations=evaluations,
        rollouts=rollouts,
        n_rollouts=int(counts["rollouts"] or 0),
        n_transitions=int(counts["transitions"] or 0),
        page=page,
    )


def _tenant_condition(scope: Scope, column: str = "tenant") -> tuple[str, dict[str, Any]]:
    """An SQL condition on ``column`` (a fixed name from this module) limiting rows to ``scope``, with its
    named parameter."""
    if scope.operator:
        return "TRUE", {}
    return f"{column} = $tenant", {"tenant": scope.tenant}


Series = Literal["version", "agent"]
Bucket = Literal["hour", "day", "week"]
BUCKETS: tuple[Bucket, ...] = ("hour", "day", "week")
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def bucket_name(raw: str | None, default: Bucket = "day") -> Bucket:
    """The time bucket of a reward plot, from the query string; a 400 (``BadRequest``) for any other."""
    if raw is None or raw == "":
        return default
    for b in BUCKETS:
        if raw == b:
            return b
    raise invalid("bucket", raw, f"one of {', '.join(BUCKETS)}")


def reward_over_time(
    lake: ViewerLake,
    scope: Scope,
    *,
    by: Series,
    bucket: Bucket = "day",
    versions: list[str] | None = None,
    sampled_by: str | None = None,
    agent: str | None = None,
) -> pl.DataFrame:
    """Mean final reward of the scope's rollouts per time bucket (of their end, UTC) and per policy version or
    agent, with a 95% normal interval of the mean (null below two rollouts): columns bucket, key, n, mean, low, high.

    ``versions``: with ``by="version"``, only these versions' series; ``sampled_by``: only rollouts this version
    sampled (a call of theirs); ``agent``: only that agent's rollouts. A rollout counts once under each version
    and agent it has (the silver step stores both lists without repeats). Cached per `trajectories` Delta
    version: the same question of an unchanged table is answered without a scan.
    """
    table_version = lake.lake.version("trajectories")
    key = (table_version, scope, by, bucket, tuple(versions) if versions is not None else None, sampled_by, agent)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    frame = _reward_over_time(lake, scope, by=by, bucket=bucket, versions=versions, sampled_by=sampled_by, agent=agent)
    if table_version is not None:
        with _cache_lock:
            _cache[key] = frame
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return frame


CACHE_SIZE = 128
_cache: OrderedDict[tuple[object, ...], pl.DataFrame] = OrderedDict()
_cache_lock = threading.Lock()
_US = {"hour": 3_600_000_000, "day": 86_400_000_000, "week": 7 * 86_400_000_000}
# Weeks start on Monday, as date_trunc's do: 1970-01-01 (epoch 0) was a Thursday, 3 days after one.
_OFFSET_US = {"hour": 0, "day": 0, "week": 3 * 86_400_000_000}


def _reward_over_time(
    lake: ViewerLake,
    scope: Scope,
    *,
    by: Series,
    bucket: Bucket,
    versions: list[str] | None,
    sampled_by: str | None,
    agent: str | None,
) -> pl.DataFrame:
    cond, params = _tenant_condition(scope)
    column = REGISTRY_VERSIONS_SQL if by == "version" else "agents"
    # (`versions` filters series after the unnest: a list intersection per row is three times slower.)
    # Buckets by integer arithmetic on epoch microseconds: date_trunc on a timestamp with a time zone goes
    # through ICU calendars, five times slower on a large table.
    frame = lake.frame(
        f"""
        WITH r AS (
            SELECT (epoch_us(end_time) + $offset) // $width * $width - $offset AS bucket_us,
                   unnest({column}) AS key, final_reward AS reward
            FROM trajectories
            WHERE final_reward IS NOT NULL AND end_time IS NOT NULL AND {cond}
              AND ($sampled_by IS NULL OR list_contains({REGISTRY_VERSIONS_SQL}, $sampled_by))
              AND ($agent IS NULL OR list_contains(agents, $agent))
        )
        SELECT make_timestamp(bucket_us) AS bucket, key, count(*) AS n, avg(reward) AS mean,
               stddev_samp(reward) AS sd
        FROM r WHERE key IS NOT NULL AND ($by <> 'version' OR $versions IS NULL OR list_contains($versions, key))
        GROUP BY bucket_us, key ORDER BY bucket_us, key
        """,
        {
            **params,
            "width": _US[bucket],
            "offset": _OFFSET_US[bucket],
            "versions": versions,
            "sampled_by": sampled_by,
            "agent": agent,
            "by": by,
        },
    )
    half = pl.lit(Z95) * pl.col("sd") / pl.col("n").cast(pl.Float64).sqrt()
    return frame.select(
        pl.col("bucket").dt.replace_time_zone("UTC"),
        "key",
        "n",
        "mean",
        (pl.col("mean") - half).alias("low"),
        (pl.col("mean") + half).alias("high"),
    )
