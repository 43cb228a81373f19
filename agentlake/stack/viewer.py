"""The local stack's trajectory viewer: `agentlake ui` as a managed process named ``viewer``.

It reads the lake the stack's settings name (its environment, as every child's), binds ``viewer.host``
(loopback by default) on ``viewer.port``, or a free port with a warning when that one is taken: its
address is recorded in the stack file, where links (Dagster metadata, `agentlake model show`) find it.
"""

from __future__ import annotations

import ipaddress
import sys

from agentlake.stack.ports import preferred_or_free
from schemas.config import Settings

PART = "viewer"
PROBE_PATH = "/static/viewer.css"  # answers 200 with or without tokens configured


def is_loopback(host: str) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def choose_port(settings: Settings) -> tuple[int, str]:
    """(port, warning): ``viewer.port`` while free, else a free one with a warning (0: a free one, quietly)."""
    return preferred_or_free(settings.viewer.port, settings.viewer.host, "the viewer (viewer.port)")


def argv(settings: Settings, port: int) -> list[str]:
    """`agentlake ui` on ``port``: the lake and tokens come from the child's environment (the stack's settings)."""
    return [sys.executable, "-m", "agentlake", "ui", "--host", settings.viewer.host, "--port", str(port)]


def url(host: str, port: int) -> str:
    return f"http://{host}:{port}"
