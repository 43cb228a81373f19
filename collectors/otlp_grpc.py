"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` on grpc.aio.

The handler takes the raw request bytes (no deserializer) so that it shares decoding, hashing
and delivery with the HTTP receiver. Errors map to INVALID_ARGUMENT, UNAUTHENTICATED, and the
retryable UNAVAILABLE / RESOURCE_EXHAUSTED that OTel exporters back off on.

``grpc.health.v1.Health/Check`` answers what an export would get now: SERVING, or NOT_SERVING with
the reason in the trailing metadata ``agentlake-reason`` (the same report as HTTP ``/health``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from collectors.errors import CollectorError, public_message
from collectors.intake import Collector
from collectors.records import encode_response

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
# grpc.health.v1.HealthCheckResponse{status}: field 1, varint; SERVING = 1, NOT_SERVING = 2.
SERVING = b"\x08\x01"
NOT_SERVING = b"\x08\x02"
SERVICE_UNKNOWN = b"\x08\x03"

HealthCheck = Callable[[], Awaitable[dict[str, Any]]]
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def trace_service_handler(collector: Collector) -> grpc.GenericRpcHandler:
    """A generic handler for TraceService/Export that feeds ``collector``."""

    async def export(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            auth = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
            tenant = collector.tenant_for(auth if isinstance(auth, str) else None)
            split = await collector.export_traces(request, fmt="protobuf", tenant=tenant)
        except CollectorError as exc:
            await context.abort(_CODES[exc.grpc_code], public_message(exc))
        return encode_response("protobuf", split.rejected_spans, split.error_message)

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {"Export": grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)},
    )


def _health_service_name(request: bytes) -> str:
    """``HealthCheckRequest.service`` (field 1, a string); "" when absent or unreadable."""
    if len(request) >= 2 and request[0] == 0x0A and request[1] < 0x80:
        return request[2 : 2 + request[1]].decode("utf-8", "replace")
    return ""


def health_service_handler(health: HealthCheck) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health/Check`` for "" (the server) and the trace service."""

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if _health_service_name(request) not in ("", SERVICE):
            return SERVICE_UNKNOWN
        report = await health()
        if report.get("status") == "ok":
            return SERVING
        reason = " ".join(str(report.get("reason", "unavailable")).split()).encode("ascii", "replace").decode()
        context.set_trailing_metadata((("agentlake-reason", reason),))
        return NOT_SERVING

    return grpc.method_handlers_generic_handler(
        HEALTH_SERVICE,
        {"Check": grpc.unary_unary_rpc_method_handler(check, request_deserializer=None, response_serializer=None)},
    )


def create_server(collector: Collector, health: HealthCheck | None = None) -> grpc.aio.Server:
    """A grpc.aio server with the trace service and our body limit (larger bodies: RESOURCE_EXHAUSTED)."""
    limit = collector.settings.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 1 << 20),
            ("grpc.so_reuseport", 0),
        ]
    )
    handlers = [trace_service_handler(collector)]
    if health is not None:
        handlers.append(health_service_handler(health))
    server.add_generic_rpc_handlers(tuple(handlers))
    return server
