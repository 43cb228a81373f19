"""The rollouts list: ``trajectories`` rows filtered, sorted and paged, one row per rollout attempt.

Filters arrive as query-string text and are checked into ``RolloutFilters`` first (a ``FilterError``
names what is wrong). The SQL is built from fixed fragments only; every value is a DuckDB parameter
and the sort column comes from ``SORTS``. Pages are ordered by the sort column and then by
(tenant, rollout_id, attempt_id), which is unique, so paging is stable. A response id is looked up in
``spans`` (so a rollout whose spans retention removed is found by its rollout or trace id only).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlencode

import polars as pl

from viewer.auth import Scope
from viewer.lake import ViewerLake
from viewer.queries import REGISTRY_VERSIONS_SQL
from viewer.queries import filters as f
from viewer.queries.filters import FilterError

STATUSES = ("running", "finished", "failed", "timed_out")
# sort key -> column (a fixed allow-list: the only way a visitor's text picks SQL)
SORTS = {
    "start_time": "start_time",
    "end_time": "end_time",
    "reward": "final_reward",
    "calls": "n_llm_calls",
    "rollout": "rollout_id",
    "task": "task_id",
    "status": "status",
    "tenant": "tenant",
}
MAX_PER_PAGE = 500
COLUMNS = (
    "rollout_id, attempt_id, tenant, task_id, status, agents, n_llm_calls, n_spans, start_time, end_time, "
    "final_reward, policy_versions"
)


@dataclass(frozen=True)
class RolloutFilters:
    """What the rollouts list shows: every field optional; ``q`` searches rollout, trace and response ids."""

    agent: str | None = None
    task: str | None = None
    tenant: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    policy_version: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    status: str | None = None
    q: str | None = None
    sort: str = "start_time"
    order: str = "desc"
    page: int = 1
    per_page: int = 50

    def query_string(self, **changes: Any) -> str:
        """This filter set (with ``changes``) as a query string, unset values left out: for links."""
        values = replace(self, **changes)
        out: dict[str, str] = {}
        for field in fields(values):
            v = getattr(values, field.name)
            if v is None or v == getattr(RolloutFilters, field.name, None):
                continue
            out[field.name] = v.isoformat() if isinstance(v, dt.datetime) else str(v)
        return urlencode(out)


PARAMS = tuple(field.name for field in fields(RolloutFilters))


def parse_filters(params: Mapping[str, str]) -> RolloutFilters:
    """The query string checked into filters; a ``FilterError`` says which value is wrong and why."""
    f.only_known(params.keys(), PARAMS)
    out = RolloutFilters(
        agent=f.text("agent", params.get("agent")),
        task=f.text("task", params.get("task")),
        tenant=f.text("tenant", params.get("tenant")),
        reward_min=f.number("reward_min", params.get("reward_min")),
        reward_max=f.number("reward_max", params.get("reward_max")),
        policy_version=f.text("policy_version", params.get("policy_version")),
        since=f.timestamp("since", params.get("since")),
        until=f.timestamp("until", params.get("until")),
        status=f.choice("status", params.get("status"), STATUSES),
        q=f.text("q", params.get("q")),
        sort=f.choice("sort", params.get("sort"), SORTS, default="start_time") or "start_time",
        order=f.choice("order", params.get("order"), ("asc", "desc"), default="desc") or "desc",
        page=f.page_number(params.get("page")),
        per_page=f.integer("per_page", params.get("per_page"), default=50, low=1, high=MAX_PER_PAGE),
    )
    if out.reward_min is not None and out.reward_max is not None and out.reward_min > out.reward_max:
        raise FilterError(f"reward_min ({out.reward_min}) is above reward_max ({out.reward_max})")
    if out.since is not None and out.until is not None and out.since > out.until:
        raise FilterError("since is after until")
    return out


@dataclass(frozen=True)
class RolloutPage:
    rows: pl.DataFrame
    filters: RolloutFilters
    has_next: bool


def where(scope: Scope, flt: RolloutFilters) -> tuple[str, list[Any]]:
    """The WHERE clause (fixed fragments joined with AND) and its parameters, in order."""
    tenant_sql, params = scope.tenant_filter("tenant")
    parts: list[str] = [tenant_sql]

    def add(sql: str, *values: Any) -> None:
        parts.append(sql)
        params.extend(values)

    if flt.tenant is not None:
        add("tenant = ?", flt.tenant)
    if flt.agent is not None:
        add("list_contains(agents, ?)", flt.agent)
    if flt.task is not None:
        add("task_id = ?", flt.task)
    if flt.reward_min is not None:
        add("final_reward >= ?", flt.reward_min)
    if flt.reward_max is not None:
        add("final_reward <= ?", flt.reward_max)
    if flt.policy_version is not None:
        # either spelling: the registry's (v0004) or the recorded one (agentlake-policy@v0004)
        add(
            f"(list_contains({REGISTRY_VERSIONS_SQL}, ?) OR list_contains(policy_versions, ?))",
            flt.policy_version,
            flt.policy_version,
        )
    if flt.since is not None:
        # the day partition first, so DuckDB skips older days' files
        add("day >= ?::DATE AND start_time >= ?", flt.since.date(), flt.since)
    if flt.until is not None:
        add("day <= ?::DATE AND start_time < ?", flt.until.date(), flt.until)
    if flt.status is not None:
        add("status = ?", flt.status)
    if flt.q is not None:
        # a response id is found through its span (one small column), not the trajectories' calls (their
        # messages and token ids would be read too); the subquery runs once
        span_tenant, span_params = scope.tenant_filter("tenant")
        add(
            "(rollout_id = ? OR list_contains(trace_ids, ?) OR list_has_any(trace_ids, "
            f"(SELECT coalesce(list(DISTINCT trace_id), []) FROM spans WHERE llm_response_id = ? AND {span_tenant})))",
            flt.q,
            flt.q,
            flt.q,
            *span_params,
        )
    return " AND ".join(parts), params


def list_rollouts(lake: ViewerLake, scope: Scope, flt: RolloutFilters) -> RolloutPage:
    """One page of rollouts in ``scope`` matching ``flt``; one extra row is read to know if a next page exists."""
    sql_where, params = where(scope, flt)
    column = SORTS[flt.sort]
    direction = "ASC" if flt.order == "asc" else "DESC"
    sql = (
        f"SELECT {COLUMNS} FROM trajectories WHERE {sql_where} "
        f"ORDER BY {column} {direction} NULLS LAST, tenant, rollout_id, attempt_id NULLS FIRST "
        "LIMIT ? OFFSET ?"
    )
    rows = lake.frame(sql, [*params, flt.per_page + 1, (flt.page - 1) * flt.per_page])
    return RolloutPage(rows=rows.head(flt.per_page), filters=flt, has_next=rows.height > flt.per_page)


def choices(lake: ViewerLake, scope: Scope) -> dict[str, list[str]]:
    """The values the filter form offers (agents, tasks, tenants, policy versions) in ``scope``, capped; a full
    scan of `trajectories` (~1.2 s at 1M rollouts), so kept a minute (``ViewerLake.cached``)."""
    return lake.cached(("rollout choices", scope), lambda: _choices(lake, scope))


def _choices(lake: ViewerLake, scope: Scope) -> dict[str, list[str]]:
    tenant_sql, params = scope.tenant_filter("tenant")
    frame = lake.frame(
        "SELECT (SELECT list(DISTINCT a ORDER BY a)[1:200] FROM (SELECT unnest(agents) AS a FROM trajectories "
        f"WHERE {tenant_sql})) AS agents, "
        "(SELECT list(DISTINCT v ORDER BY v)[1:200] FROM (SELECT unnest(policy_versions) AS v FROM trajectories "
        f"WHERE {tenant_sql})) AS versions, "
        f"(SELECT list(DISTINCT tenant ORDER BY tenant)[1:200] FROM trajectories WHERE {tenant_sql}) AS tenants",
        [*params, *params, *params],
    )
    row = frame.row(0, named=True) if frame.height else {}
    return {k: [x for x in (row.get(k) or []) if x is not None] for k in ("agents", "versions", "tenants")}
