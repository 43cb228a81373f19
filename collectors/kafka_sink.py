"""``KafkaSink``: the ``RecordSink`` that writes to Kafka with no loss, and a broker liveness probe.

The producer is idempotent with ``acks=all`` and unbounded retries inside a long delivery
timeout, so a broker that stalls for a while still gets each record exactly once. ``send`` never
blocks the event loop: kafka-python appends to its accumulator and a sender thread does the I/O;
acknowledgements come back through one ``call_soon_threadsafe`` per call, not per record.
Backpressure: when more than ``max_pending_bytes`` wait for acknowledgement, ``send`` raises
``SinkBusy`` at once (the receivers answer 429) instead of growing memory without bound.

Record size: ``kafka.max_message_bytes`` is the producer's largest request, and each topic may take
less (its ``max.message.bytes``, read at connect). ``send`` checks every record first and raises
``RecordTooLarge`` (413) naming the trace, its size and the limit before producing any of them: a
request is written whole or not at all. A record Kafka refuses as too large after all (a topic
lowered since we connected) is a ``RecordTooLarge`` too; records of the same call that Kafka took
stay written, and the topics' limits are read again so the next such record is refused up front.

Recovery: an idempotent producer that lost its broker can end in a fatal state for good (a broker
restarted without its producer state answers the epoch bump with ``InitProducerId: UnknownError``).
When a send fails, or the producer is found fatal, the sink closes it, fails every send still
waiting on it (never an acknowledgement that Kafka did not give) and connects a new one in the
background, retrying until the broker answers; ``send`` answers ``SinkUnavailable`` meanwhile.
``problem()`` says, in words, why a send would not succeed now (None when it would).
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
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError, RecordListTooLargeError

from collectors.errors import CollectorError, RecordTooLarge, SinkBusy, SinkUnavailable
from collectors.records import Record
from collectors.topic_limits import oversized, record_size, smaller_than_ours, topic_limits
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

    __slots__ = ("_future", "_left", "_lock", "_loop", "_size", "producer", "started")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], n: int, size: int, producer: object
    ) -> None:
        self._loop, self._future, self._left, self._size = loop, future, n, size
        self._lock = threading.Lock()
        self.producer = producer
        self.started = time.monotonic()

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
        stall_s: float = 2.5,
        **producer_overrides: Any,
    ) -> None:
        self.settings = settings
        self.bootstrap = bootstrap or settings.bootstrap_servers
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self.stall_s = stall_s  # a send unacknowledged for longer makes ``problem()`` say so
        self._config = {
            **settings.client_config(self.bootstrap, role="producer"),
            **PRODUCER_DEFAULTS,
            # Kafka checks a whole batch against max.message.bytes: never fill one past it.
            "batch_size": min(PRODUCER_DEFAULTS["batch_size"], settings.max_message_bytes),
            "client_id": "agentlake-collector",
            **producer_overrides,
        }
        self.limits: dict[str, int] = {}  # topic -> max.message.bytes, where the broker says
        self._producer: KafkaProducer | None = None
        self._topics: tuple[str, ...] = ()
        self._waiters: set[_Waiter] = set()
        self._failure: str | None = None  # why the current producer must be replaced
        self._recovering: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._state = f"not connected to Kafka at {self.bootstrap} yet"
        self.replacements = 0

    @property
    def connected(self) -> bool:
        return self._producer is not None

    @property
    def producer_config(self) -> dict[str, Any]:
        """The kafka-python arguments every producer of this sink is made with."""
        return dict(self._config)

    def connect(self, topics: Sequence[str] = (), timeout_s: float = 10.0) -> None:
        """Create the producer and fetch metadata of ``topics`` (blocking; run it in a thread).

        Until this succeeds ``send`` raises ``SinkUnavailable``, so a collector started before its
        broker answers 503 and recovers on its own. The producer is put in use only once it has
        the topics' metadata and a producer id from the broker (so it can send at once).
        """
        self._topics = tuple(dict.fromkeys((*self._topics, *topics)))
        if self._producer is not None:
            self.warm(self._topics, timeout_s)
            return
        try:
            producer = KafkaProducer(**self._config)
        except KafkaError as exc:
            self._state = f"cannot reach Kafka at {self.bootstrap}: {exc}"
            raise SinkUnavailable(self._state) from exc
        try:
            self._warm(producer, self._topics, timeout_s)
            self._wait_for_producer_id(producer, timeout_s)
        except BaseException:
            _close_now(producer)
            raise
        self._read_limits()
        self._producer = producer
        self._failure = None
        self._state = ""

    def _read_limits(self) -> None:
        """Learn each topic's max.message.bytes; a broker that will not say leaves ours as the limit."""
        try:
            limits = topic_limits(self.settings, self.bootstrap, self._topics)
        except (KafkaError, OSError) as exc:
            ours = self.settings.max_message_bytes
            log.info("cannot read the topics' max.message.bytes (%s); records are checked against %d bytes", exc, ours)
            return
        changed = {t: v for t, v in limits.items() if self.limits.get(t) != v}
        for line in smaller_than_ours(self.settings, changed):
            log.warning(line)
        self.limits = limits

    def warm(self, topics: Sequence[str], timeout_s: float = 10.0) -> None:
        """Fetch topic metadata now, so ``send`` never waits for it on the event loop."""
        assert self._producer is not None, "connect() first"
        self._warm(self._producer, topics, timeout_s)

    def _warm(self, producer: KafkaProducer, topics: Sequence[str], timeout_s: float) -> None:
        for topic in topics:
            deadline = time.monotonic() + timeout_s
            while not _partitions(producer, topic):
                if time.monotonic() > deadline:
                    self._state = f"topic {topic!r} has no partitions on {self.bootstrap}"
                    raise SinkUnavailable(self._state)
                time.sleep(0.1)

    def _wait_for_producer_id(self, producer: KafkaProducer, timeout_s: float) -> None:
        tm = getattr(producer, "_transaction_manager", None)
        if tm is None:
            return
        deadline = time.monotonic() + timeout_s
        while not tm.has_producer_id():
            reason = _fatal_reason(producer)
            if reason is not None or time.monotonic() > deadline:
                self._state = f"Kafka at {self.bootstrap} gives no producer id: {reason or 'no answer'}"
                raise SinkUnavailable(self._state)
            time.sleep(0.05)

    def problem(self) -> str | None:
        """Why a send would not be acknowledged now, in words; None when nothing is known wrong."""
        producer = self._producer
        if producer is None:
            return self._state or f"not connected to Kafka at {self.bootstrap}"
        reason = self._failure or _fatal_reason(producer)
        if reason is not None:
            self._start_recovery(reason)
            return f"replacing the Kafka producer: {reason}"
        oldest = min((w.started for w in self._waiters), default=None)
        if oldest is not None and time.monotonic() - oldest > self.stall_s:
            return f"Kafka at {self.bootstrap} has not acknowledged for {time.monotonic() - oldest:.1f}s"
        return None

    async def send(self, records: Sequence[Record]) -> None:
        if not records:
            return
        producer = self._producer
        if producer is None:
            raise SinkUnavailable(f"{self._state or 'not connected to Kafka'}; retry shortly")
        reason = self._failure or _fatal_reason(producer)
        if reason is not None:
            self._start_recovery(reason)
            raise SinkUnavailable(f"replacing the Kafka producer ({reason}); retry shortly")
        ours = self.settings.max_message_bytes
        too_big = oversized(records, self.limits, ours)
        if too_big is not None:
            record, n, limit = too_big
            raise _too_large(
                record, n, f"over the limit of {limit} bytes", ours, written="nothing of this request was written"
            )
        size = sum(len(r.value) + len(r.key or b"") for r in records)
        if self.pending_bytes + size > self.max_pending_bytes and self.pending_bytes:
            raise SinkBusy(f"{self.pending_bytes} bytes are waiting for Kafka; retry shortly")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = _Waiter(loop, future, len(records), size, producer)
        self.pending_bytes += size
        self._waiters.add(waiter)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch())
        try:
            for r in records:
                try:
                    f = producer.send(r.topic, value=r.value, key=r.key, headers=r.headers)
                except (KafkaError, AssertionError) as exc:  # too large, metadata timeout, closed producer
                    waiter.failed(exc)
                    break
                f.add_callback(waiter.ok)
                f.add_errback(waiter.failed)
            try:
                await future
            except (MessageSizeTooLargeError, RecordListTooLargeError) as exc:
                # Our check passed, so the topic takes less than we knew: learn its limit for next time.
                loop.run_in_executor(None, self._read_limits)
                biggest = max(records, key=record_size)
                raise _too_large(
                    biggest,
                    record_size(biggest),
                    f"which Kafka refused as too large ({type(exc).__name__})",
                    ours,
                    written="traces of this request that Kafka took before it stay written",
                ) from exc
            except (KafkaError, AssertionError) as exc:
                if producer is self._producer:
                    # A batch given up on (or refused by a fatal producer): this producer's
                    # sequence state is no longer trustworthy; use a new one.
                    self._start_recovery(f"{type(exc).__name__}: {exc}")
                raise SinkUnavailable(f"Kafka did not acknowledge: {exc}") from exc
        finally:
            self._waiters.discard(waiter)
            self.pending_bytes -= size

    # --- recovery ------------------------------------------------------------------------------
    def _start_recovery(self, reason: str) -> None:
        """Replace the current producer in the background (once; later calls join it)."""
        if self._failure is None:
            self._failure = reason
            log.warning("Kafka producer unusable (%s); replacing it", reason)
        if self._recovering is not None and not self._recovering.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # called off the loop: the next send (on the loop) starts it
        self._recovering = loop.create_task(self._recover())

    async def _watch(self) -> None:
        """While sends wait: a producer the broker answers but that acknowledges nothing for
        ``2 * stall_s`` (at least 5 s) is stuck (e.g. retrying ``UnknownProducerId`` forever
        against a broker restarted without its state): replace it."""
        limit = max(2 * self.stall_s, 5.0)
        while self._waiters:
            await asyncio.sleep(0.5)
            producer = self._producer
            oldest = min((w.started for w in self._waiters if w.producer is producer), default=None)
            if producer is None or oldest is None or time.monotonic() - oldest < limit:
                continue
            if await kafka_ping(self.bootstrap, protocol=self.settings.security_protocol):
                self._start_recovery(f"Kafka answers but acknowledged nothing for {time.monotonic() - oldest:.1f}s")

    async def _recover(self) -> None:
        old = self._producer
        reason = self._failure or "producer replaced"
        self._producer = None
        self._state = f"replacing the Kafka producer: {reason}"
        for waiter in [w for w in self._waiters if w.producer is old]:
            waiter.failed(SinkUnavailable(f"Kafka producer replaced before it acknowledged ({reason})"))
        if old is not None:
            await asyncio.to_thread(_close_now, old)
        self.replacements += 1
        while True:
            try:
                await asyncio.to_thread(self.connect, (), 5.0)
            except CollectorError as exc:
                self._state = f"replacing the Kafka producer ({reason}): {exc}"
                log.warning("%s; retrying in 1s", self._state)
                await asyncio.sleep(1.0)
                continue
            log.info("new Kafka producer connected to %s", self.bootstrap)
            return

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
        for task in (self._recovering, self._watchdog):
            if task is not None:
                task.get_loop().call_soon_threadsafe(task.cancel)
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.flush(timeout=timeout_s)
            producer.close(timeout=timeout_s)
        except KafkaTimeoutError:
            log.warning("Kafka did not acknowledge every buffered record within %.0fs", timeout_s)
            _close_now(producer)


def _too_large(record: Record, size: int, limit: str, ours: int, *, written: str) -> RecordTooLarge:
    """The 413 for a trace too big for one Kafka record: which trace, its size, the limit, and what to do."""
    trace = (record.key or b"?").decode("ascii", "replace")
    return RecordTooLarge(
        f"trace {trace} makes a Kafka record of {size} bytes for topic {record.topic!r}, {limit} "
        f"(the smaller of kafka.max_message_bytes = {ours} and the topic's max.message.bytes); {written}. "
        "Send the trace in smaller pieces (the spans of one trace may come in several requests) or raise the limit"
    )


def _partitions(producer: KafkaProducer, topic: str) -> set[int] | None:
    try:
        return producer.partitions_for(topic)
    except KafkaError:
        return None


def _fatal_reason(producer: KafkaProducer) -> str | None:
    """Why ``producer`` can never send again (its idempotence state is fatal), or None."""
    tm = getattr(producer, "_transaction_manager", None)
    if tm is not None and tm.has_fatal_error():
        return f"producer in a fatal state: {tm.last_error}"
    return None


def _close_now(producer: KafkaProducer) -> None:
    """Close without waiting: pending batches fail (their senders get 503 and retry elsewhere)."""
    try:
        producer.close(timeout=0)
    except KafkaTimeoutError:  # kafka-python's close(0) flushes first and times out: force it
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()  # its thread aborts the incomplete batches and exits
    except Exception:  # noqa: BLE001 - a broken producer must not stop its replacement
        log.exception("closing the old Kafka producer failed")


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
