"""The collector's receivers: OTLP/HTTP and OTLP/gRPC in one event loop, started and stopped cleanly.

``CollectorServer`` owns the sink's lifecycle: it connects the Kafka producer in the background
(so the process is up, answering 503, before the broker is), and on ``stop`` it lets in-flight
requests finish, then flushes the producer, so a SIGTERM loses nothing that was acknowledged.

TLS (``collector.tls_certfile`` / ``tls_keyfile``, and ``tls_client_cafile`` for client
certificates) covers both receivers: HTTPS on the HTTP port, a secure port for gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from collectors.errors import CollectorError
from collectors.intake import Collector
from collectors.kafka_sink import KafkaSink, kafka_ping
from collectors.listen import HttpListener
from collectors.otlp_grpc import create_server
from collectors.otlp_http import create_app
from collectors.sink import RecordSink
from collectors.tls import grpc_credentials, uvicorn_tls
from schemas.config import Settings

log = logging.getLogger(__name__)


class CollectorServer:
    """Both receivers plus the sink; ``http_port`` / ``grpc_port`` are known after ``start``."""

    def __init__(self, settings: Settings, sink: RecordSink | None = None) -> None:
        self.settings = settings
        if sink is None:
            if not settings.kafka.external:
                raise CollectorError(
                    "no Kafka configured: set KAFKA_BOOTSTRAP_SERVERS (or kafka.bootstrap_servers), "
                    "or start the local stack with `agentlake up`"
                )
            sink = KafkaSink(settings.kafka, stall_s=settings.collector.produce_timeout_s)
        self.sink = sink
        self.collector = Collector(sink, settings.collector, settings.kafka)
        self.http_port = 0
        self.grpc_port = 0
        self._http: HttpListener | None = None
        self._grpc: Any = None
        self._connect_task: asyncio.Task[None] | None = None
        self._health_cache: tuple[float, bool] = (0.0, False)

    async def health(self) -> dict[str, Any]:
        """What a client would get now (``status`` ok or unavailable, with the ``reason``), and counters.

        Unavailable while the producer is being connected or replaced, while sends stay
        unacknowledged, or while the broker does not answer (probed at most once a second).
        """
        problem = await self.problem()
        stats = self.collector.stats
        report: dict[str, Any] = {
            "status": "ok" if problem is None else "unavailable",
            "kafka": "reachable" if problem is None else "unavailable",
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "acknowledged_spans": stats.acknowledged_spans,
            "rejected_spans": stats.rejected_spans,
            "acknowledged_rewards": stats.acknowledged_rewards,
            "failures": stats.failures,
        }
        if problem is not None:
            report["reason"] = problem
        if isinstance(self.sink, KafkaSink):
            report["producer_replacements"] = self.sink.replacements
        return report

    async def problem(self) -> str | None:
        """Why a request would not be acknowledged now, or None."""
        if not isinstance(self.sink, KafkaSink):
            return None
        problem = self.sink.problem()
        if problem is not None:
            return problem
        at, ok = self._health_cache
        if time.monotonic() - at > 1.0:
            ok = await kafka_ping(self.sink.bootstrap, protocol=self.settings.kafka.security_protocol)
            self._health_cache = (time.monotonic(), ok)
        return None if ok else f"Kafka at {self.sink.bootstrap} does not answer"

    async def start(self) -> None:
        """Connect (in the background) and start listening on both ports."""
        cfg = self.settings.collector
        tls = uvicorn_tls(cfg)  # checks the TLS files first: a missing one fails before anything listens
        credentials = grpc_credentials(cfg)
        if isinstance(self.sink, KafkaSink):
            topics = (self.settings.kafka.spans_topic, self.settings.kafka.rewards_topic)
            self._connect_task = asyncio.create_task(self.sink.connect_until_up(topics))
        self._grpc = create_server(self.collector, self.health)
        address = f"{cfg.host}:{cfg.grpc_port}"
        if credentials is None:
            self.grpc_port = self._grpc.add_insecure_port(address)
        else:
            self.grpc_port = self._grpc.add_secure_port(address, credentials)
        await self._grpc.start()
        self._http = HttpListener(
            create_app(self.collector, self.health), cfg.host, cfg.http_port, tls=tls, graceful_s=15
        )
        self.http_port = self._http.port
        await self._http.start()
        log.info(
            "collector listening: OTLP/HTTP%s %s:%d, OTLP/gRPC%s %s:%d",
            "S" if tls else "",
            cfg.host,
            self.http_port,
            " (TLS)" if tls else "",
            cfg.host,
            self.grpc_port,
        )

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish, then flush and close the producer."""
        if self._connect_task is not None:
            self._connect_task.cancel()
        if self._http is not None:
            await self._http.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=10)
        if isinstance(self.sink, KafkaSink):
            await asyncio.to_thread(self.sink.close, self.settings.collector.produce_timeout_s * 3)


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    server = CollectorServer(settings)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
