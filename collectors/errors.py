"""Errors of the collectors, each mapped to one HTTP status and one gRPC code.

    AgentlakeError
    └── CollectorError                 (status, grpc_code, retryable)
        ├── BadRequest                 400 / INVALID_ARGUMENT   malformed body, bad field
        ├── Unauthorized               401 / UNAUTHENTICATED    missing or unknown bearer token
        ├── PayloadTooLarge            413 / RESOURCE_EXHAUSTED body over collector.max_body_bytes
        │   └── RecordTooLarge         413 / INVALID_ARGUMENT   a trace bigger than a Kafka record may be
        ├── UnsupportedMediaType       415 / INVALID_ARGUMENT   unknown content type or encoding
        └── SinkError                  retryable: the record store did not acknowledge in time
            ├── SinkBusy               429 / RESOURCE_EXHAUSTED too much is waiting for Kafka
            └── SinkUnavailable        503 / UNAVAILABLE        Kafka is down, slow or unreachable

Receivers translate these at the boundary; nothing else decides a status code.
"""

from __future__ import annotations

from schemas.errors import AgentlakeError

# gRPC status code numbers (grpc.StatusCode values), kept here so decoding never imports grpc.
GRPC_INVALID_ARGUMENT = 3
GRPC_RESOURCE_EXHAUSTED = 8
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14
GRPC_UNAUTHENTICATED = 16


class CollectorError(AgentlakeError):
    """Base of the errors a receiver answers with; ``status`` is the HTTP code."""

    status: int = 500
    grpc_code: int = GRPC_INTERNAL
    retryable: bool = False


class BadRequest(CollectorError):
    status = 400
    grpc_code = GRPC_INVALID_ARGUMENT


class Unauthorized(CollectorError):
    status = 401
    grpc_code = GRPC_UNAUTHENTICATED


class PayloadTooLarge(CollectorError):
    status = 413
    grpc_code = GRPC_RESOURCE_EXHAUSTED


class RecordTooLarge(PayloadTooLarge):
    """One trace makes a Kafka record bigger than its topic takes; retrying the same body cannot help,
    so gRPC gets INVALID_ARGUMENT (exporters retry RESOURCE_EXHAUSTED)."""

    grpc_code = GRPC_INVALID_ARGUMENT


class UnsupportedMediaType(CollectorError):
    status = 415
    grpc_code = GRPC_INVALID_ARGUMENT


class SinkError(CollectorError):
    """The sink could not take or acknowledge records now; the sender should retry later."""

    status = 503
    grpc_code = GRPC_UNAVAILABLE
    retryable = True
    retry_after_s: int = 1


class SinkBusy(SinkError):
    status = 429
    grpc_code = GRPC_RESOURCE_EXHAUSTED


class SinkUnavailable(SinkError):
    status = 503
    grpc_code = GRPC_UNAVAILABLE


MAX_MESSAGE_CHARS = 1000


def safe_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters and made encodable as UTF-8.

    Error messages quote what the client sent, and a hostile body can put a lone surrogate or a
    megabyte-long key there; an answer that cannot be encoded would become a 500 and a dropped
    connection instead of the 400 it is.
    """
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def public_message(exc: BaseException) -> str:
    """What a receiver tells the client about ``exc``: its message, safe to send."""
    return safe_text(str(exc))
