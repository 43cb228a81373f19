"""OTLP/HTTP receiver (``POST /v1/traces``), ``POST /v1/rewards`` and ``GET /health`` on Starlette.

Every answer follows the OTLP/HTTP spec: success and errors in the request's encoding (errors as
``google.rpc.Status``), ``Retry-After`` on 429/503 so the standard exporters back off and retry.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from google.rpc import status_pb2
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collectors.errors import BadRequest, CollectorError, PayloadTooLarge, SinkError, public_message
from collectors.intake import Collector
from collectors.records import BodyFormat, body_format, encode_response

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

HealthCheck = Callable[[], Awaitable[dict[str, Any]]]


async def read_body(request: Request, limit: int) -> bytes:
    """The request body as sent (Content-Encoding is undone while decoding, off the event loop),
    refusing more than ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit} bytes")
        except ValueError as exc:
            raise BadRequest(f"bad Content-Length {declared!r}") from exc
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise BadRequest("client disconnected before sending the whole body") from exc
    return b"".join(chunks)


def error_response(exc: CollectorError, fmt: BodyFormat | None) -> Response:
    """An OTLP error answer: ``google.rpc.Status`` in the request's encoding, Retry-After if retryable."""
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, SinkError) else None
    status = status_pb2.Status(code=exc.grpc_code, message=public_message(exc))
    if fmt == "protobuf":
        return Response(status.SerializeToString(), exc.status, headers=headers, media_type=PROTOBUF)
    return Response(json_format.MessageToJson(status, indent=None), exc.status, headers=headers, media_type=JSON)


def internal_error(exc: Exception, fmt: BodyFormat | None) -> Response:
    """A 500 for a bug of ours, logged with its traceback, answered like any other error.

    Letting the exception reach the server would also answer 500, but then uvicorn closes the
    connection, and the client's next request on it fails too.
    """
    log.exception("request failed")
    error = CollectorError(f"internal error ({type(exc).__name__}); retry, and report it if it persists")
    return error_response(error, fmt)


def create_app(collector: Collector, health: HealthCheck) -> Starlette:
    """The Starlette app of the OTLP/HTTP receiver, bound to one ``Collector``."""
    limit = collector.settings.max_body_bytes

    async def traces(request: Request) -> Response:
        fmt: BodyFormat | None = None
        try:
            fmt = body_format(request.headers.get("content-type"))
            tenant = collector.tenant_for(request.headers.get("authorization"))
            body = await read_body(request, limit)
            encoding = request.headers.get("content-encoding")
            split = await collector.export_traces(body, fmt=fmt, tenant=tenant, encoding=encoding)
        except CollectorError as exc:
            return error_response(exc, fmt)
        except Exception as exc:  # noqa: BLE001 - a bug still answers, and the connection stays open
            return internal_error(exc, fmt)
        media = PROTOBUF if fmt == "protobuf" else JSON
        return Response(encode_response(fmt, split.rejected_spans, split.error_message), media_type=media)

    async def rewards(request: Request) -> Response:
        try:
            if body_format(request.headers.get("content-type")) != "json":
                raise BadRequest("reward events are JSON: send Content-Type: application/json")
            tenant = collector.tenant_for(request.headers.get("authorization"))
            body = await read_body(request, limit)
            accepted = await collector.post_rewards(
                body, tenant=tenant, encoding=request.headers.get("content-encoding")
            )
        except CollectorError as exc:
            return error_response(exc, "json")
        except Exception as exc:  # noqa: BLE001 - a bug still answers, and the connection stays open
            return internal_error(exc, "json")
        return JSONResponse({"accepted": accepted})

    async def healthz(_: Request) -> Response:
        report = await health()
        return Response(json.dumps(report), 200 if report.get("status") == "ok" else 503, media_type="application/json")

    return Starlette(
        routes=[
            Route("/v1/traces", traces, methods=["POST"]),
            Route("/v1/rewards", rewards, methods=["POST"]),
            Route("/health", healthz, methods=["GET"]),
        ]
    )
