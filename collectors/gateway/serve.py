"""Run the gateway: uvicorn on ``gateway.host:port`` (TLS when ``gateway.tls_certfile`` is set), spans
through a disk spill to Kafka, clean SIGTERM.

Recorded calls go to the spill (``<state>/spill/gateway``, see collectors.gateway.spill) and from
there to Kafka, in order, whenever Kafka answers; a gateway started on a non-empty spill resends it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from pathlib import Path

import httpx

from collectors.errors import CollectorError
from collectors.gateway.proxy import Gateway
from collectors.gateway.routes import create_app
from collectors.gateway.spill import SpillSink
from collectors.kafka_sink import KafkaSink
from collectors.listen import HttpListener
from collectors.sink import RecordSink
from collectors.tls import uvicorn_tls
from schemas.config import Settings

log = logging.getLogger(__name__)


def spill_dir(settings: Settings) -> Path:
    """Where the gateway keeps calls Kafka has not acknowledged yet."""
    return settings.state.dir.resolve() / "spill" / "gateway"


class GatewayServer:
    """The gateway app on a socket; ``port`` is known after ``start``.

    ``sink`` is where spans end up (Kafka unless given); the spill always sits in front of it.
    ``client`` is the HTTP client for the upstreams (tests give an in-process one).
    """

    def __init__(
        self, settings: Settings, sink: RecordSink | None = None, *, client: httpx.AsyncClient | None = None
    ) -> None:
        self.settings = settings
        if sink is None:
            if not settings.kafka.external:
                raise CollectorError(
                    "no Kafka configured for the gateway's spans: set KAFKA_BOOTSTRAP_SERVERS, or use `agentlake up`"
                )
            sink = KafkaSink(settings.kafka)
        self.sink = sink
        self.spill = SpillSink(sink, spill_dir(settings), max_bytes=settings.gateway.spill_max_bytes)
        self.gateway = Gateway(settings, self.spill, client=client)
        self.port = 0
        self._listener: HttpListener | None = None
        self._connect: asyncio.Task[None] | None = None

    async def start(self) -> None:
        g = self.settings.gateway
        tls = uvicorn_tls(g)  # checks the TLS files before anything starts
        self.spill.start()  # takes the spill folder (one gateway each), resends what it holds
        if isinstance(self.sink, KafkaSink):
            # the calls wait in the spill while Kafka is away
            self._connect = asyncio.create_task(self.sink.connect_until_up((self.settings.kafka.spans_topic,), 5.0))
        self._listener = HttpListener(
            create_app(self.gateway), g.host, g.port, tls=tls, graceful_s=int(min(g.request_timeout_s, 60))
        )
        self.port = self._listener.port
        await self._listener.start()
        log.info(
            "gateway listening on %s://%s:%d -> %s (%s)",
            "https" if tls else "http",
            g.host,
            self.port,
            ", ".join(self.gateway.upstreams),
            "anonymous calls allowed" if self.gateway.auth.anonymous else "bearer token required",
        )
        if self.gateway.auth.anonymous and not _loopback(g.host):
            log.warning(
                "the gateway on %s takes calls without a token: set collector.auth_tokens and "
                "gateway.admin_token, or bind gateway.host to 127.0.0.1",
                g.host,
            )

    async def stop(self) -> None:
        """Finish in-flight calls, spill their spans, send what Kafka takes now, flush the producer.

        What Kafka does not take stays in the spill for the next start.
        """
        if self._listener is not None:
            await self._listener.stop()
        await self.gateway.close()
        await self.spill.close(timeout_s=10.0)
        if self._connect is not None:
            self._connect.cancel()
        if isinstance(self.sink, KafkaSink):
            await asyncio.to_thread(self.sink.close, 30.0)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def run(settings: Settings, stop: asyncio.Event) -> None:
    server = GatewayServer(settings)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
