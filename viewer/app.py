"""The viewer's Starlette app: the page modules' routes, /static, the login form and the error pages.

``create_app(settings)`` reads the lake the settings name (``Lake.from_settings``); tests and
``agentlake ui --lake`` may pass another ``Lake``. The app writes nothing: the only state it keeps is
the DuckDB views over the lake (``app.state.lake``) and the token rule (``app.state.auth``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import import_module
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from pipelines.gold.retokenize import policy_retokenizer
from schemas.config import Settings
from schemas.lake import Lake
from viewer.auth import COOKIE, Unauthenticated, ViewerAuth
from viewer.errors import HANDLERS
from viewer.lake import ViewerLake
from viewer.queries.tokens import TokenText
from viewer.templating import STATIC_DIR, render

# The page modules (viewer/pages/<name>.py), each exposing ``routes``.
PAGES = ("rollouts", "rollout", "versions", "health")


def page_routes() -> list[BaseRoute]:
    routes: list[BaseRoute] = []
    for name in PAGES:
        routes.extend(import_module(f"viewer.pages.{name}").routes)
    return routes


async def home(request: Request) -> Response:
    return RedirectResponse("/rollouts", status_code=303)


async def login_form(request: Request) -> Response:
    nxt = _local_path(request.query_params.get("next", "/rollouts"))
    return render(request, "login.html", {"title": "Token", "message": "", "next": nxt})


async def login(request: Request) -> Response:
    """Checks the token, then keeps it in an HTTP-only cookie (the browser sends it back on each page)."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    nxt = _local_path((form.get("next") or ["/rollouts"])[0])
    auth: ViewerAuth = request.app.state.auth
    auth.scope_for_token(token)  # Unauthenticated -> the login page again, 401
    response = RedirectResponse(nxt, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response


def _local_path(target: str) -> str:
    """Only a path on this site is a redirect target (no open redirect to another host)."""
    return target if target.startswith("/") and not target.startswith("//") else "/rollouts"


def create_app(settings: Settings, lake: Lake | None = None) -> Starlette:
    """The viewer over ``lake`` (default: the settings' lake), with the settings' tokens."""
    viewer_lake = ViewerLake(lake if lake is not None else Lake.from_settings(settings))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        viewer_lake.close()

    routes: list[BaseRoute] = [
        Route("/", home),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout),
        *page_routes(),
        Mount("/static", app=StaticFiles(directory=str(STATIC_DIR)), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers=dict(HANDLERS), lifespan=lifespan)
    app.state.settings = settings
    app.state.lake = viewer_lake
    app.state.auth = ViewerAuth(settings)
    app.state.tokens = TokenText(policy_retokenizer(settings))  # the gold step's tokenizer, loaded once
    return app


__all__ = ["PAGES", "Unauthenticated", "create_app"]
