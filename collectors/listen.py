"""uvicorn on a socket we bind ourselves, with signals left to the process shell.

Both the collector's OTLP/HTTP receiver and the gateway serve this way: binding first lets port 0
pick a free port that is known before the first request, and the shell (collectors.process) owns
SIGTERM/SIGINT for the whole process, so uvicorn must not install handlers of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to us (we own the whole process's shutdown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening socket for uvicorn; port 0 picks a free one (read it back from the socket)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this. Without it, a response written in two segments waits
    # for the client's delayed ACK: 40 ms added to every request (uvicorn sets it only on
    # sockets it creates itself).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HttpListener:
    """An ASGI app served by uvicorn on ``host:port`` until ``stop``: the one way our servers start and stop.

    ``start`` returns once uvicorn accepts connections (or raises what stopped it), so a caller can
    announce the port; ``stop`` lets in-flight requests finish, up to ``graceful_s``.
    """

    def __init__(self, app: Any, host: str, port: int, *, tls: dict[str, Any], graceful_s: int) -> None:
        self.sock = bind(host, port)
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=graceful_s,
            server_header=False,
            **tls,
        )
        self._server = QuietServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            await self._task
            self._task = None
