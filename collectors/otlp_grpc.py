"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` on grpc.aio.

The handler takes the raw request bytes (no deserializer) so that it shares decoding, hashing
and delivery with the HTTP receiver. Errors map to INVALID_ARGUMENT, UNAUTHENTICATED, and the
retryable UNAVAILABLE / RESOURCE_EXHAUSTED that OTel exporters back off on.
"""

from __future__ import annotations

import grpc

from collectors.errors import CollectorError
from collectors.records import encode_response
from collectors.service import Collector

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def trace_service_handler(collector: Collector) -> grpc.GenericRpcHandler:
    """A generic handler for TraceService/Export that feeds ``collector``."""

    async def export(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            auth = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
            tenant = collector.tenant_for(auth if isinstance(auth, str) else None)
            split = await collector.export_traces(request, fmt="protobuf", tenant=tenant)
        except CollectorError as exc:
            await context.abort(_CODES[exc.grpc_code], str(exc))
        return encode_response("protobuf", split.rejected_spans, split.error_message)

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {"Export": grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)},
    )


def create_server(collector: Collector) -> grpc.aio.Server:
    """A grpc.aio server with the trace service and our body limit (larger bodies: RESOURCE_EXHAUSTED)."""
    limit = collector.settings.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 1 << 20),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers((trace_service_handler(collector),))
    return server
