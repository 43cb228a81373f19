"""The gateway's HTTP answers in OpenAI's shape, and its one way of reading a request body.

Errors are ``{"error": {"message", "type", "code"}}`` as OpenAI clients expect; JSON answers render
whatever the upstream sent; a body is read under ``gateway.max_body_bytes`` (413 while being read,
never buffered whole) and refused with 400 when it is not JSON.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from collectors.errors import CollectorError
from collectors.otlp_http import read_body

ERROR_KINDS = {401: "authentication_error", 403: "permission_error", 413: "request_too_large"}


def openai_error(
    status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None
) -> JSONResponse:
    """An OpenAI-shaped error answer."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def json_response(data: Any) -> Response:
    """A JSON answer that renders whatever the upstream sent (NaN, lone surrogates) instead of failing."""
    return Response(json.dumps(data, separators=(",", ":")), media_type="application/json")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, limit: int, *, optional: bool = False) -> Any | Response:
    """The request's JSON body, reading at most ``limit`` bytes; an error answer otherwise.

    ``optional``: an empty body is ``{}`` (else it is not JSON: 400).
    """
    try:
        raw = await read_body(request, limit)
    except CollectorError as exc:
        message = str(exc)
        if exc.status == 413:
            message = f"request body too large: {exc} (the gateway's gateway.max_body_bytes)"
        return openai_error(exc.status, message, ERROR_KINDS.get(exc.status, "invalid_request_error"))
    if optional and not raw.strip():
        return {}
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return openai_error(400, f"request body is not valid JSON: {exc}")
