"""Who may call the gateway: tenants by the collector's bearer tokens, the operator by the admin token.

A caller's tenant comes from the same rule as the collector's (``Collector.tenant_for`` over
``collector.auth_tokens``), so one token means one tenant at both doors. The gateway requires a
known token unless anonymous calls are allowed (``gateway.allow_anonymous``; by default only while
no tokens are configured, as on a local stack); anonymous callers are tenant ``default``.

``/admin/*`` (pause, resume, state) takes only ``gateway.admin_token``: a tenant token is refused
(403), and with no admin token configured the admin endpoints answer only while anonymous calls are
allowed. A tenant token is the gateway's credential, never forwarded to the upstream.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from collectors.intake import Collector, bearer_token
from collectors.sink import MemorySink
from schemas.config import Settings


@dataclass(frozen=True)
class Refusal:
    """Why an admin request is refused: the HTTP status (401 or 403) and the message."""

    status: int
    message: str


class GatewayAuth:
    """The gateway's two checks: a caller's tenant, and the operator's admin token."""

    def __init__(self, settings: Settings) -> None:
        self.anonymous = settings.gateway.anonymous_allowed(settings.collector.auth_tokens)
        self._tokens = frozenset(settings.collector.auth_tokens)
        self._admin = settings.gateway.admin_token
        rule = settings.collector.model_copy(update={"require_auth": not self.anonymous})
        # Only its tenant_for is used: the collector's own token rule, so the two never disagree.
        self._collector = Collector(MemorySink(), rule, settings.kafka)

    def tenant(self, authorization: str | None) -> str:
        """The caller's tenant; raises ``collectors.errors.Unauthorized`` when a token is required and
        this one is not known."""
        return self._collector.tenant_for(authorization)

    def is_ours(self, authorization: str | None) -> bool:
        """True when the header carries one of our tokens (tenant or admin): it stops at the gateway."""
        token = bearer_token(authorization)
        return token is not None and (token in self._tokens or self._is_admin(token))

    def _is_admin(self, token: str) -> bool:
        return bool(self._admin) and hmac.compare_digest(token.encode(), self._admin.encode())

    def admin_refusal(self, authorization: str | None) -> Refusal | None:
        """None when the caller may pause, resume or read the gateway's state; else why not."""
        token = bearer_token(authorization)
        if self._admin:
            if token is None:
                return Refusal(401, "missing admin token: send 'Authorization: Bearer <gateway.admin_token>'")
            if not self._is_admin(token):
                return Refusal(403, "this token may not use the admin endpoints: use gateway.admin_token")
            return None
        if self.anonymous:
            return None
        return Refusal(403, "the admin endpoints are off: set gateway.admin_token and send it as a bearer token")
