"""/versions (the registry's versions, reward per version and per agent) and /versions/{version} (its lineage,
the rollouts it trained on, its evaluations, its tracker run, the reward of what it sampled).

Handlers are plain functions, run on Starlette's thread pool (see viewer/pages/health.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from viewer.auth import request_scope
from viewer.errors import NotFound
from viewer.plots import reward_plot
from viewer.queries import versions as q
from viewer.queries.filters import page_number
from viewer.templating import render


def rollout_href(rollout_id: str, tenant: str | None = None) -> str:
    """The rollout page of ``rollout_id`` (any character quoted, "/" included), of ``tenant`` (two tenants may
    use one id)."""
    return "/rollouts/" + quote(rollout_id, safe="") + ("?" + urlencode({"tenant": tenant}) if tenant else "")


def version_href(version: str) -> str:
    return "/versions/" + quote(version, safe="")


def _pages(page: int, total: int, params: dict[str, Any]) -> dict[str, Any]:
    """Links to the previous and next page, keeping the other parameters."""
    last = max(1, -(-total // q.PER_PAGE))
    keep = {k: v for k, v in params.items() if v not in (None, "") and k != "page"}

    def link(n: int) -> str:
        return "?" + urlencode({**keep, "page": n})

    return {
        "page": page,
        "last": last,
        "prev": link(page - 1) if page > 1 else None,
        "next": link(page + 1) if page < last else None,
    }


def versions_page(request: Request) -> Response:
    scope = request_scope(request)
    params = dict(request.query_params)
    f = q.VersionsFilter.parse(params)
    bucket = q.bucket_name(params.get("bucket"))
    lake = request.app.state.lake
    rows, total = q.list_versions(lake, scope, f)
    by_version = q.reward_over_time(lake, scope, by="version", bucket=bucket, agent=f.agent)
    by_agent = q.reward_over_time(lake, scope, by="agent", bucket=bucket, agent=f.agent)
    return render(
        request,
        "versions.html",
        {
            "title": "Model versions",
            "filter": f,
            "bucket": bucket,
            "buckets": q.BUCKETS,
            "statuses": q.STATUSES,
            "agents": q.agents(lake),
            "rows": rows.to_dicts(),
            "total": total,
            "pager": _pages(f.page, total, params),
            "version_href": version_href,
            "plot_versions": reward_plot(
                by_version, title="Reward per policy version", series_label="version", bucket=bucket
            ),
            "plot_agents": reward_plot(by_agent, title="Reward per agent", series_label="agent", bucket=bucket),
        },
    )


def version_page(request: Request) -> Response:
    scope = request_scope(request)
    version = q.version_name(request.path_params["version"])
    params = dict(request.query_params)
    page = page_number(params.get("page"))
    bucket = q.bucket_name(params.get("bucket"))
    lake = request.app.state.lake
    detail = q.version_detail(lake, scope, version, page=page)
    if detail is None:
        raise NotFound(f"Model version {version!r}")
    # the version beside its parent and children, so a step up or down shows; and per agent, its own rollouts
    family = (
        [a["version"] for a in detail.ancestors[:1]]
        + [version]
        + [d["version"] for d in detail.descendants if d["parent_version"] == version]
    )
    by_version = q.reward_over_time(lake, scope, by="version", bucket=bucket, versions=family)
    by_agent = q.reward_over_time(lake, scope, by="agent", bucket=bucket, sampled_by=version)
    rollouts = [{**r, "href": rollout_href(r["rollout_id"], r["tenant"])} for r in detail.rollouts.to_dicts()]
    return render(
        request,
        "version.html",
        {
            "title": f"Model version {version}",
            "v": detail.row,
            "detail": detail,
            "rollouts": rollouts,
            "evaluations": detail.evaluations.to_dicts(),
            "bucket": bucket,
            "buckets": q.BUCKETS,
            "pager": _pages(page, detail.n_rollouts, params),
            "version_href": version_href,
            "plot_versions": reward_plot(
                by_version,
                title=f"Reward of rollouts sampled by {version}, its parent and children",
                series_label="version",
                bucket=bucket,
            ),
            "plot_agents": reward_plot(
                by_agent, title=f"Reward per agent, rollouts sampled by {version}", series_label="agent", bucket=bucket
            ),
        },
    )


routes: list[BaseRoute] = [
    Route("/versions", versions_page),
    Route("/versions/{version:path}", version_page),
]
