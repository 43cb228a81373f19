"""TLS for the servers we run: the same three settings become uvicorn's and grpc's options.

The collector's receivers and the gateway take ``tls_certfile`` / ``tls_keyfile`` (and, for
mutual TLS, ``tls_client_cafile``) from their settings section (schemas.config.TlsServerSettings);
empty, they serve plain HTTP / insecure gRPC, as a local stack does.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import grpc

from schemas.config import TlsServerSettings


def uvicorn_tls(settings: TlsServerSettings) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments for the section's TLS; ``{}`` when TLS is off."""
    files = settings.tls_files()
    if not files:
        return {}
    out: dict[str, Any] = {"ssl_certfile": files["tls_certfile"], "ssl_keyfile": files["tls_keyfile"]}
    if "tls_client_cafile" in files:
        out.update(ssl_ca_certs=files["tls_client_cafile"], ssl_cert_reqs=ssl.CERT_REQUIRED)
    return out


def grpc_credentials(settings: TlsServerSettings) -> grpc.ServerCredentials | None:
    """Server credentials for ``add_secure_port``; None when TLS is off (an insecure port)."""
    files = settings.tls_files()
    if not files:
        return None
    key = Path(files["tls_keyfile"]).read_bytes()
    chain = Path(files["tls_certfile"]).read_bytes()
    ca = files.get("tls_client_cafile")
    return grpc.ssl_server_credentials(
        [(key, chain)],
        root_certificates=Path(ca).read_bytes() if ca else None,
        require_client_auth=ca is not None,
    )
