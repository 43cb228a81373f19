"""Pause and resume the gateway around a full-weight vLLM restart, so agents see latency, not errors.

A paused gateway answers new calls 429 + Retry-After while in-flight ones finish; ``drain`` waits for
those (``/admin/state``'s ``in_flight``) before vLLM goes down. The same endpoints with ``?reason=restoring``
(``GATEWAY_HOLD``, ``GATEWAY_RELEASE``) hold only the policy names, 503 + Retry-After, while a loader loads
the registry's versions into a vLLM that came back without them. The gateway is optional: one that is
absent, lacks the endpoint or refuses our token is logged and publishing goes on unpaused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import httpx

log = logging.getLogger(__name__)

GATEWAY_PAUSE = "/admin/pause"
GATEWAY_RESUME = "/admin/resume"
GATEWAY_STATE = "/admin/state"
GATEWAY_HOLD = "/admin/pause?reason=restoring"
GATEWAY_RELEASE = "/admin/resume?reason=restoring"


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


def drain(gateway_url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> int:
    """Wait until a paused gateway has no call in flight (or ``timeout_s``); the calls still in flight
    (0: drained; -1: the state could not be read, so nothing is known)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            resp = httpx.get(f"{gateway_url.rstrip('/')}{GATEWAY_STATE}", headers=dict(headers or {}), timeout=10.0)
            in_flight = int(resp.json()["in_flight"]) if resp.status_code == 200 else -1
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("gateway %s state not readable (%s); restarting without draining", gateway_url, exc)
            return -1
        if in_flight <= 0 or time.monotonic() > deadline:
            if in_flight > 0:
                log.warning("gateway %s still has %d calls in flight after %.0fs", gateway_url, in_flight, timeout_s)
            return in_flight
        time.sleep(0.2)
