"""Health probes for each part of the stack: one small function per kind of endpoint."""

from __future__ import annotations

import httpx

from schemas.config import KafkaSettings


def http_ok(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 2xx."""
    try:
        return httpx.get(url, timeout=timeout_s).is_success
    except httpx.HTTPError:
        return False


def kafka_ok(settings: KafkaSettings, bootstrap: str, *, timeout_s: float = 5.0) -> bool:
    """True when the broker answers a metadata request."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(
            **settings.client_config(bootstrap),
            request_timeout_ms=int(timeout_s * 1000),
        )
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()
