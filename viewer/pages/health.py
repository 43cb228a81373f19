"""/health: reward per agent over time, ingest lag (the broker's end offsets against the lake's
watermarks), what was left out, and the asset checks' latest results (from Dagster's webserver, not the lake).

Handlers are plain functions: Starlette runs them on its thread pool, so a slow lake query does not hold up
other requests (DuckDB releases the GIL while it scans)."""

from __future__ import annotations

import datetime as dt

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from schemas.config import Settings
from viewer.auth import request_scope
from viewer.plots import reward_plot
from viewer.queries import asset_checks as ac
from viewer.queries import health as h
from viewer.queries import ingest_lag as il
from viewer.queries import versions as q
from viewer.templating import render


def dagster_base(settings: Settings) -> str:
    """The stack's Dagster webserver (its UI and its GraphQL API), as this host reaches it."""
    host = settings.dagster.host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.dagster.port}"


def dagster_url(settings: Settings) -> str:
    """The Dagster UI's assets page, where each asset's checks and their latest results are."""
    return f"{dagster_base(settings)}/assets"


def asset_checks(request: Request) -> ac.Checks:
    """The checks' latest results, kept 30 s (a page refreshed in a loop asks Dagster twice a minute)."""
    base = dagster_base(request.app.state.settings)
    return request.app.state.lake.cached(("asset checks", base), lambda: ac.fetch_checks(base), ttl_s=30.0)


def ingest_lag(request: Request) -> tuple[list[il.PartitionLag], str | None]:
    """Each partition's lag and why the broker's side is missing (None: it answered); the end offsets are kept
    10 s, so a page refreshed in a loop asks the broker (or waits on one that is down) once per 10 s."""
    lake = request.app.state.lake
    kafka = request.app.state.settings.kafka
    topics = {"spans": kafka.spans_topic, "rewards": kafka.rewards_topic}
    key = ("broker ends", kafka.bootstrap_servers, tuple(sorted(topics.values())))
    ends = lake.cached(key, lambda: il.broker_end_offsets(kafka, sorted(topics.values())), ttl_s=10.0)
    return il.lags(h.ingest_positions(lake, kafka), topics, ends.ends), ends.error


def health_page(request: Request) -> Response:
    scope = request_scope(request)
    bucket = q.bucket_name(request.query_params.get("bucket"))
    lake = request.app.state.lake
    settings: Settings = request.app.state.settings
    now = dt.datetime.now(dt.UTC)
    by_agent = q.reward_over_time(lake, scope, by="agent", bucket=bucket)
    return render(
        request,
        "health.html",
        {
            "title": "Health",
            "bucket": bucket,
            "buckets": q.BUCKETS,
            "plot_agents": reward_plot(by_agent, title="Reward per agent", series_label="agent", bucket=bucket),
            "lag": ingest_lag(request) if scope.operator else None,
            # full scans of trajectories and transitions (~1 s each on 1M rollouts): kept a minute
            "counts": lake.cached(("left out", scope), lambda: h.left_out(lake, scope, settings.credit, now)),
            "quarantine": h.recent_quarantine(lake, scope),
            "dagster_url": dagster_url(settings),
            "checks": asset_checks(request) if scope.operator else None,
            "now": now,
        },
    )


routes: list[BaseRoute] = [Route("/health", health_page)]
