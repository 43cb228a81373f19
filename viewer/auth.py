"""Who is looking: a tenant (sees only its rows) or the operator (sees all), from the project's tokens.

The viewer takes the tokens the collector and gateway already use: ``collector.auth_tokens`` (bearer
token -> tenant) for tenants and ``gateway.admin_token`` for the operator. With no token configured
(a local stack) every visitor is the operator, and the viewer must bind to loopback (``must_bind_loopback``),
as the gateway does while anonymous. The token comes as ``Authorization: Bearer <token>`` or from the
cookie the login form sets.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.requests import Request

from collectors.intake import bearer_token
from schemas.config import Settings

COOKIE = "agentlake_viewer_token"


@dataclass(frozen=True)
class Scope:
    """The rows a request may see: ``operator`` sees every tenant; otherwise only ``tenant``'s."""

    tenant: str | None
    operator: bool

    def __post_init__(self) -> None:
        if not self.operator and not self.tenant:
            raise ValueError("a non-operator scope needs a tenant")

    def tenant_filter(self, column: str = "tenant") -> tuple[str, list[str]]:
        """An SQL condition and its parameters limiting rows to this scope (``TRUE`` for the operator).

        ``column`` is a fixed column name from the caller's code, never user input."""
        if self.operator:
            return "TRUE", []
        return f"{column} = ?", [self.tenant or ""]


OPERATOR = Scope(tenant=None, operator=True)


class Unauthenticated(Exception):
    """No token, or one that is not known, while tokens are configured: the login page answers (401)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ViewerAuth:
    """Resolves a request's ``Scope`` from the configured tokens."""

    def __init__(self, settings: Settings) -> None:
        self._tenants = dict(settings.collector.auth_tokens)
        self._admin = settings.gateway.admin_token

    @property
    def anonymous(self) -> bool:
        """True when no token is configured: every visitor is the operator."""
        return not self._tenants and not self._admin

    def scope_for_token(self, token: str | None) -> Scope:
        """The scope of ``token``; raises ``Unauthenticated`` when tokens are configured and it is not one."""
        if self.anonymous:
            return OPERATOR
        if not token:
            raise Unauthenticated("this viewer needs a token: a tenant token or the operator's admin token")
        if self._admin and hmac.compare_digest(token.encode(), self._admin.encode()):
            return OPERATOR
        for known, tenant in self._tenants.items():
            if hmac.compare_digest(token.encode(), known.encode()):
                return Scope(tenant=tenant, operator=False)
        raise Unauthenticated("unknown token")

    def scope(self, request: Request) -> Scope:
        """The request's scope, from its bearer token or the login cookie."""
        token = bearer_token(request.headers.get("authorization")) or request.cookies.get(COOKIE)
        return self.scope_for_token(token)


def must_bind_loopback(settings: Settings) -> bool:
    """True when the viewer answers without a token, so it may listen on loopback only (as the gateway)."""
    return ViewerAuth(settings).anonymous


def request_scope(request: Request) -> Scope:
    """The current request's scope (``request.app.state.auth``), kept on ``request.state`` for the templates;
    pages call this first."""
    auth: ViewerAuth = request.app.state.auth
    scope = auth.scope(request)
    request.state.scope = scope
    return scope
