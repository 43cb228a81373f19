"""The viewer's error pages: 400 (a filter value that is not valid, with the reason), 401 (a token is
needed: the login form), 404 (no such rollout, version or page). Never a 500 for bad input."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from viewer.auth import Unauthenticated
from viewer.templating import render


class BadRequest(Exception):
    """A query parameter that is not valid; ``reason`` names it and says what is accepted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotFound(Exception):
    """What the URL names is not in the lake (or not in the visitor's tenant, which reads the same)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


async def bad_request(request: Request, exc: Exception) -> Response:
    reason = exc.reason if isinstance(exc, BadRequest) else str(exc)
    return render(request, "error.html", {"title": "Bad request", "message": reason}, status_code=400)


async def not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, NotFound):
        message = f"{exc.what} is not in the lake."
    else:
        message = f"No page at {request.url.path}."
    return render(request, "error.html", {"title": "Not found", "message": message}, status_code=404)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return await not_found(request, exc)
    title = {400: "Bad request", 405: "Method not allowed"}.get(exc.status_code, "Error")
    return render(request, "error.html", {"title": title, "message": str(exc.detail)}, status_code=exc.status_code)


async def unauthenticated(request: Request, exc: Exception) -> Response:
    reason = exc.reason if isinstance(exc, Unauthenticated) else str(exc)
    response = render(
        request, "login.html", {"title": "Token needed", "message": reason, "next": request.url.path}, status_code=401
    )
    response.headers["WWW-Authenticate"] = 'Bearer realm="agentlake viewer"'
    return response


HANDLERS = {
    BadRequest: bad_request,
    NotFound: not_found,
    Unauthenticated: unauthenticated,
    HTTPException: http_error,
}
