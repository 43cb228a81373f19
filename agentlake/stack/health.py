"""Health probes for each part of the stack: one small function per kind of endpoint."""

from __future__ import annotations

import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import httpx

from schemas.config import GatewaySettings, KafkaSettings, TlsServerSettings
from schemas.kafka import kafka_python_config


def http_ok(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 2xx."""
    try:
        return httpx.get(url, timeout=timeout_s).is_success
    except httpx.HTTPError:
        return False


def server_ok(server: TlsServerSettings, url: str, *, timeout_s: float = 2.0) -> bool:
    """``http_ok`` for a server of ours (collector, gateway) that may serve TLS.

    The probe runs beside the process `agentlake up` started with that certificate, and asks only
    whether it is alive, so it does not verify the certificate (its CA need not be on this host).
    With client certificates required (``tls_client_cafile``) the probe has none to show: a
    completed TLS handshake on the port is the answer.
    """
    if not server.tls:
        return http_ok(url, timeout_s=timeout_s)
    if server.tls_client_cafile:
        parts = urlsplit(url)
        return tls_handshake_ok(parts.hostname or "127.0.0.1", parts.port or 443, timeout_s=timeout_s)
    try:
        return httpx.get(url, timeout=timeout_s, verify=False).is_success
    except httpx.HTTPError:
        return False


def tls_handshake_ok(host: str, port: int, *, timeout_s: float = 2.0) -> bool:
    """True when ``host:port`` completes a TLS handshake (certificate not verified, none presented)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock, ctx.wrap_socket(sock):
            return True
    except ssl.SSLError as exc:
        return "CERTIFICATE_REQUIRED" in exc.reason if exc.reason else False  # TLS 1.2: refused after hello
    except OSError:
        return False


def gateway_spill(url: str, *, timeout_s: float = 2.0, verify: bool = True) -> str | None:
    """The gateway's spill as one line (calls waiting for Kafka, their bytes, calls dropped), from its /health.

    None when the gateway does not answer or reports no spill.
    """
    try:
        r = httpx.get(url, timeout=timeout_s, verify=verify)
        spill: Any = r.json().get("spill") if r.is_success else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(spill, dict):
        return None
    line = f"spill: {spill.get('records', 0)} calls ({_size(spill.get('bytes', 0))}) waiting for Kafka"
    line += f", {spill.get('dropped', 0)} dropped"
    if spill.get("last_error"):
        line += f" ({spill['last_error']})"
    return line


def gateway_restoring(server: GatewaySettings, *, timeout_s: float = 2.0) -> bool:
    """True while the gateway holds the policy names (a loader restoring the registry's versions); its
    /health says so to anyone."""
    url = f"{server.url}/health"
    try:
        r = httpx.get(url, timeout=timeout_s, verify=False)
        return bool(r.json().get("restoring")) if r.is_success else False
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def _size(n: Any) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop returns


def kafka_ok(settings: KafkaSettings, bootstrap: str, *, timeout_s: float = 5.0) -> bool:
    """True when the broker answers a metadata request within ``timeout_s`` (also its bootstrap: an
    unreachable broker or a failed TLS handshake would otherwise hold `agentlake status` for 30 s)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(
            **kafka_python_config(settings, bootstrap),
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
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
