"""The process shell shared by ``python -m collectors`` and ``python -m collectors.gateway``.

Both serve until SIGTERM or SIGINT, then stop gracefully; a configuration or startup error
(``AgentlakeError``) is printed to stderr and exits 2, so the stack manager sees one contract.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from schemas.config import Settings, load_settings
from schemas.errors import AgentlakeError

Serve = Callable[[Settings, asyncio.Event], Awaitable[None]]


async def _serve_until_signalled(serve: Serve) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(load_settings(), stop)


def run_server(serve: Serve) -> int:
    """Run ``serve(settings, stop)`` until SIGTERM/SIGINT sets ``stop``; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signalled(serve))
    except AgentlakeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
