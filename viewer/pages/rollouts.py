"""/rollouts: the rollouts list (filters, sort, pages, search)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from viewer.auth import request_scope
from viewer.templating import render


async def rollouts_page(request: Request) -> Response:
    request_scope(request)
    return render(request, "rollouts.html", {"title": "Rollouts", "rows": []})


routes: list[BaseRoute] = [Route("/rollouts", rollouts_page)]
