"""``python -m collectors.gateway``: the OpenAI-compatible gateway, configured by agentlake settings."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from collectors.gateway.server import run
from schemas.config import load_settings
from schemas.errors import AgentlakeError


async def _main() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run(load_settings(), stop)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_main())
    except AgentlakeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
