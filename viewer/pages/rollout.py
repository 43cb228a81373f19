"""/rollouts/{rollout_id}: one rollout (spans, LLM calls, transitions' tokens, rewards, credit variants)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from viewer.auth import request_scope
from viewer.errors import NotFound


async def rollout_page(request: Request) -> Response:
    request_scope(request)
    raise NotFound(f"rollout {request.path_params['rollout_id']!r}")


routes: list[BaseRoute] = [Route("/rollouts/{rollout_id}", rollout_page)]
