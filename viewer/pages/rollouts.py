"""/rollouts: the rollouts list (filters, sort, pages, search by rollout, trace or response id)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from viewer.auth import request_scope
from viewer.queries.rollouts import SORTS, STATUSES, choices, list_rollouts, parse_filters
from viewer.templating import render


async def rollouts_page(request: Request) -> Response:
    scope = request_scope(request)
    flt = parse_filters(request.query_params)  # a FilterError is a BadRequest: the 400 page
    lake = request.app.state.lake
    page = list_rollouts(lake, scope, flt)
    return render(
        request,
        "rollouts.html",
        {
            "title": "Rollouts",
            "page": page,
            "f": flt,
            "rows": page.rows.to_dicts(),
            "choices": lake.cached(("rollout-choices", scope), lambda: choices(lake, scope)),
            "statuses": STATUSES,
            "sorts": list(SORTS),
        },
    )


routes: list[BaseRoute] = [Route("/rollouts", rollouts_page)]
