"""A TLS listener in front of a plaintext broker: Kafka over TLS (mutual, if asked) with the real Tansu behind it.

Tansu is started listening on one port and advertising the proxy's, so every client connection,
bootstrap and broker alike, goes through TLS.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
from pathlib import Path

from agentlake.stack.broker import broker_binary
from agentlake.stack.ports import free_port, wait_for_port
from tests.tls import TlsFiles


class TlsBroker:
    """Tansu on a private plaintext port, reachable only through a TLS proxy at ``bootstrap``."""

    def __init__(self, files: TlsFiles, *, require_client_cert: bool = True, log: Path | None = None) -> None:
        self.files = files
        self.require_client_cert = require_client_cert
        self.log = log
        self.inner_port = free_port()
        self.port = free_port()
        self._tansu: subprocess.Popen[bytes] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.files.ca))
        ctx.load_cert_chain(self.files.server_cert, self.files.server_key)
        ctx.verify_mode = ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_NONE
        return ctx

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.inner_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port, ssl=self._context())

    def start(self) -> TlsBroker:
        inner = f"tcp://127.0.0.1:{self.inner_port}"
        argv = [
            broker_binary(),
            "broker",
            "--listener-url",
            inner,
            "--advertised-listener-url",
            f"tcp://{self.bootstrap}",
        ]
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - owned by the process
        self._tansu = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port("127.0.0.1", self.inner_port)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
        if self._tansu is not None and self._tansu.poll() is None:
            self._tansu.terminate()
            try:
                self._tansu.wait(10)
            except subprocess.TimeoutExpired:
                self._tansu.kill()
                self._tansu.wait()

    def __enter__(self) -> TlsBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
