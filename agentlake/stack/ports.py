"""Local TCP ports: pick a free one, check one is free, wait until something listens on one."""

from __future__ import annotations

import socket
import time

from agentlake.stack.processes import StackError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on ``port`` now (with SO_REUSEADDR, as servers bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def preferred_or_free(port: int, host: str, what: str) -> tuple[int, str]:
    """(port, warning): ``port`` while it is free, else a free one and a warning naming ``what`` (the setting);
    0: a free one, quietly. For parts whose address the stack file records, so moving is better than failing."""
    if port == 0:
        return free_port(), ""
    if not port_free(port, host):
        other = free_port()
        return other, f"{what}'s port {port} is taken: it listens on {other} instead"
    return port, ""


def wait_for_port(host: str, port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise StackError(f"nothing is listening on {host}:{port} after {timeout_s:.0f}s")
