"""The servers we run, ``[collector]`` and ``[gateway]``, with the TLS settings they share."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from schemas.config.base import Section
from schemas.errors import ConfigError


class TlsServerSettings(Section):
    """TLS for a server we run (the collector's receivers, the gateway): off while ``tls_certfile`` is empty.

    ``tls_certfile`` / ``tls_keyfile``: the server's certificate chain and private key (PEM).
    ``tls_client_cafile``: a CA (PEM); when set, every client must present a certificate it signed
    (mutual TLS). The files are read when the server starts; a missing one is a ``ConfigError`` then.
    """

    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_client_cafile: str = ""

    @model_validator(mode="after")
    def _tls_complete(self) -> TlsServerSettings:
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError("TLS needs both tls_certfile and tls_keyfile (PEM files)")
        if self.tls_client_cafile and not self.tls_certfile:
            raise ValueError("tls_client_cafile (client certificates) needs TLS on: set tls_certfile and tls_keyfile")
        return self

    @property
    def tls(self) -> bool:
        """True when the server speaks TLS."""
        return bool(self.tls_certfile)

    def tls_files(self) -> dict[str, str]:
        """The TLS files that are set, each checked to exist (a clear error at start, not a handshake failure)."""
        files = {k: v for k in ("tls_certfile", "tls_keyfile", "tls_client_cafile") if (v := getattr(self, k))}
        for key, path in files.items():
            if not Path(path).is_file():
                raise ConfigError(f"{key}: {path} is not a file")
        return files


class CollectorSettings(TlsServerSettings):
    host: str = "127.0.0.1"
    http_port: int = Field(4318, ge=0, le=65535)
    grpc_port: int = Field(4317, ge=0, le=65535)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    require_auth: bool = False
    auth_tokens: dict[str, str] = Field(default_factory=dict)  # bearer token -> tenant
    # How long a request waits for Kafka's acknowledgement before it is answered 503 + Retry-After
    # (gRPC UNAVAILABLE): well inside the OTel exporter's 10 s deadline, so exporters retry.
    produce_timeout_s: float = Field(2.5, gt=0)

    @property
    def http_url(self) -> str:
        """Where OTLP/HTTP exporters reach the collector (https when TLS is on)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    @field_validator("auth_tokens")
    @classmethod
    def _tokens_non_empty(cls, v: dict[str, str]) -> dict[str, str]:
        for token, tenant in v.items():
            if not token or not tenant:
                raise ValueError("tokens and tenants must be non-empty strings")
        return v


class GatewaySettings(TlsServerSettings):
    """The OpenAI-compatible gateway. Callers authenticate with the collector's tokens
    (``collector.auth_tokens``, bearer token -> tenant): their calls are recorded under that tenant.

    ``allow_anonymous``: calls without a known token are served as tenant ``default``. Unset, it is on
    only while ``collector.auth_tokens`` is empty (a local stack); with tokens, set it true explicitly
    to let anonymous callers in. ``admin_token``: the bearer token of ``/admin/pause|resume|state``;
    empty, those answer only while anonymous calls are allowed (403 otherwise).
    ``max_body_bytes``: a larger request is refused with 413 before it is read; keep it well under
    ``kafka.max_message_bytes``, since the call's span holds the whole request.
    """

    host: str = "127.0.0.1"
    port: int = Field(4000, ge=0, le=65535)
    upstreams: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"])
    request_timeout_s: float = Field(600.0, gt=0)
    # Recorded calls wait on disk (<state>/spill/gateway) until Kafka acknowledges them; past this
    # many pending bytes new calls are dropped (counted at /health and in `agentlake status`).
    spill_max_bytes: int = Field(512 << 20, ge=64 << 10)
    allow_anonymous: bool | None = None
    admin_token: str = ""
    max_body_bytes: int = Field(4 << 20, ge=1024)
    # Start holding policy-name calls (503 + Retry-After) until a loader says the registry's versions are loaded
    # again (`/admin/resume?reason=restoring`): `agentlake up` sets it when it starts a loader beside vLLM.
    hold_until_restored: bool = False
    restoring_retry_after_s: int = Field(5, ge=1, le=3600)  # the Retry-After of those 503s

    def anonymous_allowed(self, auth_tokens: Mapping[str, str]) -> bool:
        """Whether calls without a known token are served (as tenant ``default``)."""
        return self.allow_anonymous if self.allow_anonymous is not None else not auth_tokens

    @property
    def url(self) -> str:
        """Where clients reach the gateway (https when TLS is on)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def admin_headers(self) -> dict[str, str]:
        """The headers an operator's tool sends to ``/admin/*``: the admin token, when one is set."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
