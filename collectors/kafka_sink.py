"""``KafkaSink``: the ``RecordSink`` that writes to Kafka with no loss, and a broker liveness probe.

The producer is idempotent with ``acks=all`` and unbounded retries inside a long delivery
timeout, so a broker that stalls for a while still gets each record exactly once. ``send`` never
blocks the event loop: kafka-python appends to its accumulator and a sender thread does the I/O;
acknowledgements come back through one ``call_soon_threadsafe`` per call, not per record.
Backpressure: when more than ``max_pending_bytes`` wait for acknowledgement, ``send`` raises
``SinkBusy`` at once (the receivers answer 429) instead of growing memory without bound.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

from collectors.errors import PayloadTooLarge, SinkBusy, SinkUnavailable
from collectors.records import Record
from schemas.config import KafkaSettings

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 2,
    "batch_size": 1 << 20,
    "max_in_flight_requests_per_connection": 5,
    "delivery_timeout_ms": 300_000,
    "request_timeout_ms": 30_000,
    "max_block_ms": 10_000,
    "retry_backoff_ms": 100,
}


class _Waiter:
    """Counts acknowledgements of one ``send`` call on the sender thread; wakes the loop once."""

    __slots__ = ("_future", "_left", "_lock", "_loop", "_size")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], n: int, size: int) -> None:
        self._loop, self._future, self._left, self._size = loop, future, n, size
        self._lock = threading.Lock()

    def ok(self, _metadata: object) -> None:
        with self._lock:
            self._left -= 1
            done = self._left == 0
        if done:
            self._loop.call_soon_threadsafe(_settle, self._future, None)

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._left <= 0:
                return
            self._left = -1
        self._loop.call_soon_threadsafe(_settle, self._future, exc)


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


class KafkaSink:
    """Writes records with an idempotent ``acks=all`` producer; see the module docstring."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        bootstrap: str | None = None,
        max_pending_bytes: int = 256 << 20,
        max_request_bytes: int = 16 << 20,
        **producer_overrides: Any,
    ) -> None:
        self.settings = settings
        self.bootstrap = bootstrap or settings.bootstrap_servers
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self._config = {
            **settings.client_config(self.bootstrap),
            **PRODUCER_DEFAULTS,
            "max_request_size": max_request_bytes + (64 << 10),
            "client_id": "agentlake-collector",
            **producer_overrides,
        }
        self._producer: KafkaProducer | None = None

    @property
    def connected(self) -> bool:
        return self._producer is not None

    def connect(self, topics: Sequence[str] = (), timeout_s: float = 10.0) -> None:
        """Create the producer and fetch metadata of ``topics`` (blocking; run it in a thread).

        Until this succeeds ``send`` raises ``SinkUnavailable``, so a collector started before its
        broker answers 503 and recovers on its own.
        """
        if self._producer is None:
            try:
                self._producer = KafkaProducer(**self._config)
            except KafkaError as exc:
                raise SinkUnavailable(f"cannot reach Kafka at {self.bootstrap}: {exc}") from exc
        self.warm(topics, timeout_s)

    def warm(self, topics: Sequence[str], timeout_s: float = 10.0) -> None:
        """Fetch topic metadata now, so ``send`` never waits for it on the event loop."""
        assert self._producer is not None, "connect() first"
        for topic in topics:
            deadline = time.monotonic() + timeout_s
            while not self._partitions(topic):
                if time.monotonic() > deadline:
                    raise SinkUnavailable(f"topic {topic!r} has no partitions on {self.bootstrap}")
                time.sleep(0.1)

    def _partitions(self, topic: str) -> set[int] | None:
        assert self._producer is not None
        try:
            return self._producer.partitions_for(topic)
        except KafkaError:
            return None

    async def send(self, records: Sequence[Record]) -> None:
        if not records:
            return
        producer = self._producer
        if producer is None:
            raise SinkUnavailable(f"not connected to Kafka at {self.bootstrap} yet; retry shortly")
        size = sum(len(r.value) + len(r.key or b"") for r in records)
        if self.pending_bytes + size > self.max_pending_bytes and self.pending_bytes:
            raise SinkBusy(f"{self.pending_bytes} bytes are waiting for Kafka; retry shortly")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = _Waiter(loop, future, len(records), size)
        self.pending_bytes += size
        try:
            for r in records:
                try:
                    f = producer.send(r.topic, value=r.value, key=r.key, headers=r.headers)
                except MessageSizeTooLargeError as exc:
                    waiter.failed(exc)
                    break
                except KafkaTimeoutError as exc:
                    waiter.failed(exc)
                    break
                f.add_callback(waiter.ok)
                f.add_errback(waiter.failed)
            try:
                await future
            except MessageSizeTooLargeError as exc:
                raise PayloadTooLarge(f"one trace is too large for a Kafka record: {exc}") from exc
            except KafkaError as exc:
                raise SinkUnavailable(f"Kafka did not acknowledge: {exc}") from exc
        finally:
            self.pending_bytes -= size

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until buffered records are acknowledged (or ``timeout_s`` passes)."""
        if self._producer is None:
            return
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaTimeoutError:
            log.warning("Kafka did not acknowledge every buffered record within %.0fs", timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush, then close the producer; called on SIGTERM."""
        if self._producer is None:
            return
        self.flush(timeout_s)
        self._producer.close(timeout=timeout_s)
        self._producer = None


# --- liveness probe -------------------------------------------------------------------------------
_API_VERSIONS_REQUEST = struct.pack(">hhih", 18, 0, 0x6167, 9) + b"agentlake"


async def kafka_ping(bootstrap: str, *, timeout_s: float = 1.0, protocol: str = "PLAINTEXT") -> bool:
    """True when some bootstrap broker answers a Kafka ApiVersions request within ``timeout_s``.

    A frozen broker still accepts TCP connections (the kernel does that), so only an answer to a
    real request counts. For SSL/SASL listeners we only check that a connection opens.
    """
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
        except (TimeoutError, OSError, ValueError):
            continue
        try:
            if protocol != "PLAINTEXT":
                return True
            writer.write(struct.pack(">i", len(_API_VERSIONS_REQUEST)) + _API_VERSIONS_REQUEST)
            await writer.drain()
            header = await asyncio.wait_for(reader.readexactly(8), timeout_s)
            if struct.unpack(">ii", header)[1] == 0x6167:
                return True
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            continue
        finally:
            writer.close()
    return False
