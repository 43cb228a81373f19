"""The gateway's HTTP surface: which URL does what, and who may call it.

The OpenAI API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/models``, also under
``/rollout/{id}/``) and ``POST /rollout/{id}/end`` are for tenants: callers authenticate with the
collector's bearer tokens (collectors.gateway.auth), and each call's spans carry the caller's tenant.
The pipeline keys every rollout by (tenant, rollout id), so a rollout id is the caller's own: tenant
B naming a rollout id tenant A uses gets a rollout of its own under that id, and can neither add
calls to A's rollout nor end or reward it. ``/admin/pause|resume|state`` take the admin token only;
``/health`` answers anyone, with the full state for the admin. ``?reason=restoring`` on pause and resume
holds and releases only the policy names (503 + Retry-After: a loader restoring the registry's versions).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collectors.errors import CollectorError
from collectors.gateway.proxy import Gateway
from collectors.gateway.replies import ERROR_KINDS, openai_error

_MAX_PAUSE_WAIT_S = 3600.0
RESTORING = "restoring"  # the pause reason of a loader restoring the registry's versions (serving.gateway_pause)


TenantHandler = Callable[[Request, str], Awaitable[Response]]
Handler = Callable[[Request], Awaitable[Response]]


def create_app(gateway: Gateway) -> Starlette:
    """Routes: OpenAI API (also under /rollout/{id}/) for tenants, admin pause/resume/state, health."""
    auth = gateway.auth

    def tenant_route(handler: TenantHandler) -> Handler:
        """The handler, called with the caller's tenant; 401 when a token is required and missing or unknown."""

        async def route(request: Request) -> Response:
            try:
                tenant = auth.tenant(request.headers.get("authorization"))
            except CollectorError as exc:
                return openai_error(exc.status, str(exc), "authentication_error", {"WWW-Authenticate": "Bearer"})
            return await handler(request, tenant)

        return route

    def admin_route(handler: Handler) -> Handler:
        """The handler, for the admin token only (401 without a token, 403 with another)."""

        async def route(request: Request) -> Response:
            refusal = auth.admin_refusal(request.headers.get("authorization"))
            if refusal is not None:
                headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
                return openai_error(refusal.status, refusal.message, ERROR_KINDS[refusal.status], headers)
            return await handler(request)

        return route

    async def chat(request: Request, tenant: str) -> Response:
        return await gateway.completion(request, "chat", tenant)

    async def completions(request: Request, tenant: str) -> Response:
        return await gateway.completion(request, "completions", tenant)

    async def responses(request: Request, tenant: str) -> Response:
        return await gateway.responses(request, tenant)

    async def models(request: Request, _tenant: str) -> Response:
        return await gateway.models(request)

    async def pause(request: Request) -> Response:
        if request.query_params.get("reason") == RESTORING:
            gateway.hold()
            return JSONResponse(_state(gateway))
        wait = request.query_params.get("wait")
        seconds = 0.0
        if wait:
            try:
                seconds = float(wait)
            except ValueError:
                seconds = math.nan
            if not 0 <= seconds <= _MAX_PAUSE_WAIT_S:
                return openai_error(400, f"wait must be seconds from 0 to {_MAX_PAUSE_WAIT_S:.0f}, got {wait!r}")
        gateway.pause()
        idle = await gateway.wait_idle(seconds) if wait else True
        return JSONResponse(_state(gateway) | {"idle": idle})

    async def resume(request: Request) -> Response:
        if request.query_params.get("reason") == RESTORING:
            gateway.release()
        else:
            gateway.resume()
        return JSONResponse(_state(gateway))

    async def state(_: Request) -> Response:
        return JSONResponse(_state(gateway))

    async def health(request: Request) -> Response:
        """Liveness for anyone; the full state (upstreams, counters, spill) only where admin is allowed."""
        if auth.admin_refusal(request.headers.get("authorization")) is None:
            return JSONResponse(_state(gateway))
        return JSONResponse({"status": "ok", "paused": gateway.paused, "restoring": gateway.restoring})

    routes = [Route("/rollout/{rollout_id}/end", tenant_route(gateway.end_rollout), methods=["POST"])]
    for prefix in ("", "/rollout/{rollout_id}"):
        routes += [
            Route(f"{prefix}/v1/chat/completions", tenant_route(chat), methods=["POST"]),
            Route(f"{prefix}/v1/completions", tenant_route(completions), methods=["POST"]),
            Route(f"{prefix}/v1/responses", tenant_route(responses), methods=["POST"]),
            Route(f"{prefix}/v1/models", tenant_route(models), methods=["GET"]),
        ]
    routes += [
        Route("/admin/pause", admin_route(pause), methods=["POST"]),
        Route("/admin/resume", admin_route(resume), methods=["POST"]),
        Route("/admin/state", admin_route(state), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _state(gateway: Gateway) -> dict[str, Any]:
    state = {
        "status": "ok",
        "paused": gateway.paused,
        "restoring": gateway.restoring,
        "in_flight": gateway.in_flight,
        "upstreams": gateway.upstreams,
        "recorded_spans": gateway.recorder.recorded_spans,
        "record_failures": gateway.recorder.record_failures,
    }
    stats = getattr(gateway.sink, "stats", None)
    if callable(stats):
        state["spill"] = stats()  # records, bytes and calls dropped (a full spill), waiting for Kafka
    return state
