"""Pause and resume the gateway around a full-weight vLLM restart, so agents see latency, not errors.

A paused gateway answers new calls 429 + Retry-After while in-flight ones finish. The gateway is
optional: one that is absent, lacks the endpoint or refuses our token is logged and publishing goes
on unpaused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import httpx

log = logging.getLogger(__name__)

GATEWAY_PAUSE = "/admin/pause"
GATEWAY_RESUME = "/admin/resume"


def gateway_call(gateway_url: str | None, path: str, *, headers: Mapping[str, str] | None = None) -> bool:
    """Pause or resume the gateway; a gateway that is absent or lacks the endpoint is tolerated.

    ``headers`` carry the gateway's admin token (``gateway.admin_token``): a locked gateway answers
    ``/admin/*`` with 401/403 without it, and publishing then goes on unpaused (logged).
    """
    if not gateway_url:
        return False
    try:
        resp = httpx.post(f"{gateway_url.rstrip('/')}{path}", headers=dict(headers or {}), timeout=10.0)
    except httpx.HTTPError as exc:
        log.warning("gateway %s%s not reachable (%s); publishing without it", gateway_url, path, exc)
        return False
    if resp.status_code >= 400:
        log.warning("gateway %s%s answered %d; publishing without it", gateway_url, path, resp.status_code)
        return False
    return True
