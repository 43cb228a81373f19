"""``KafkaSink``: the ``RecordSink`` that writes to Kafka with no loss, and a broker liveness probe.

The producer is confluent-kafka (librdkafka), configured by ``schemas.kafka.librdkafka_config``:
idempotent with ``acks=all`` and retries inside a long delivery timeout, so a broker that stalls for
a while still gets each record exactly once. ``send`` never blocks the event loop: ``produce``
appends to librdkafka's queue, its threads do the I/O, and one poll thread per producer serves the
delivery reports; a request's acknowledgement comes back through one ``call_soon_threadsafe`` per
call, not per record. Backpressure: when more than ``max_pending_bytes`` wait for acknowledgement
(or librdkafka's queue is full), ``send`` raises ``SinkBusy`` at once (the receivers answer 429)
instead of growing memory without bound.

Record size: ``kafka.max_message_bytes`` is the producer's ``message.max.bytes``, and each topic may
take less (its ``max.message.bytes``, read at connect). ``send`` checks every record first and raises
``RecordTooLarge`` (413) naming the trace, its size and the limit before producing any of them: a
request is written whole or not at all. A record refused as too large after all (``MSG_SIZE_TOO_LARGE``
from librdkafka or the broker: a topic lowered since we connected) is a ``RecordTooLarge`` too; records
of the same call that Kafka took stay written, and the topics' limits are read again so the next such
record is refused up front.

Recovery: an idempotent producer that lost its broker can end in a fatal state for good (librdkafka's
``_FATAL``, e.g. a broker restarted without its producer state), or retry for ever without an
acknowledgement. When a send fails, or the producer is found fatal or stuck, the sink closes it, fails
every send still waiting on it (never an acknowledgement that Kafka did not give) and connects a new
one in the background, retrying until the broker answers; ``send`` answers ``SinkUnavailable``
meanwhile. ``problem()`` says, in words, why a send would not succeed now (None when it would).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from collectors.errors import CollectorError, RecordTooLarge, SinkBusy, SinkUnavailable
from collectors.records import Record
from collectors.topic_limits import oversized, record_size, smaller_than_ours, topic_limits
from schemas.config import KafkaSettings
from schemas.kafka import librdkafka_config

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    # One request in flight per broker, 5 ms linger: what concurrent sends produce meanwhile goes out
    # in the next request, as bigger batches. A broker whose every write is an object-store write (the
    # durable local one) takes twice the spans/s so (benchmarks/bench_collectors.py).
    "linger.ms": 5,
    "batch.size": 1 << 20,
    "queue.buffering.max.messages": 1_000_000,  # the byte bound (max_pending_bytes) comes first
    "max.in.flight.requests.per.connection": 1,
    "delivery.timeout.ms": 300_000,
    "request.timeout.ms": 30_000,
    "retry.backoff.ms": 100,
    "client.id": "agentlake-collector",
    # Our topics are created with our settings (ensure_topics), never by a metadata request with the
    # broker's defaults (Tansu's: 4 partitions, which would break the one-partition order of a spill).
    "allow.auto.create.topics": False,
}
# librdkafka's and the broker's "too large" answers: the 413 path, never a producer replacement.
_TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}


class _QuietLog:
    """librdkafka's own log lines (a refused connection each retry) at DEBUG: what a user needs comes
    from the sink (503 reasons, ``problem()``, the recovery warnings)."""

    def log(self, _level: int, msg: str, *args: object) -> None:
        log.debug(msg, *args)


class _Client:
    """One librdkafka producer and the thread that polls it (delivery reports, errors, logs)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.fatal: str | None = None  # set by librdkafka's error callback: this producer is done
        self._stop = threading.Event()
        self.producer = Producer({**config, "error_cb": self._error, "logger": _QuietLog()})
        self._thread = threading.Thread(target=self._poll, name="kafka-sink-poll", daemon=True)
        self._thread.start()

    def _error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = f"producer in a fatal state: {err.name()}: {err.str()}"
        else:
            log.debug("Kafka producer: %s", err.str())

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.1)

    def close(self, timeout_s: float) -> int:
        """Flush up to ``timeout_s``, fail what is left (delivery reports say purged), stop; records left."""
        left = self.producer.flush(timeout_s) if timeout_s > 0 else len(self.producer)
        if left:
            self.producer.purge(in_queue=True, in_flight=True)
            self.producer.flush(1.0)  # serve the purged records' reports
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(1.0)
        self.producer.close()
        return left


class _Waiter:
    """Counts acknowledgements of one ``send`` call on the poll thread; wakes the loop once."""

    __slots__ = ("_future", "_left", "_lock", "_loop", "_size", "producer", "started")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], n: int, size: int, producer: _Client
    ) -> None:
        self._loop, self._future, self._left, self._size = loop, future, n, size
        self._lock = threading.Lock()
        self.producer = producer
        self.started = time.monotonic()

    def delivered(self, err: KafkaError | None, _msg: Message) -> None:
        """librdkafka's delivery report of one record."""
        if err is not None:
            self.failed(KafkaException(err))
            return
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
    """Writes records with an idempotent ``acks=all`` producer; see the module docstring.

    ``producer_overrides`` are librdkafka properties laid over the settings' (tests, benchmarks).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        bootstrap: str | None = None,
        max_pending_bytes: int = 256 << 20,
        stall_s: float = 2.5,
        producer_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.bootstrap = bootstrap or settings.bootstrap_servers
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self.stall_s = stall_s  # a send unacknowledged for longer makes ``problem()`` say so
        self._config = {
            **librdkafka_config(settings, self.bootstrap, role="producer"),
            **PRODUCER_DEFAULTS,
            # Kafka checks a whole batch against max.message.bytes: never fill one past it.
            "batch.size": min(PRODUCER_DEFAULTS["batch.size"], settings.max_message_bytes),
            **(producer_overrides or {}),
        }
        self.limits: dict[str, int] = {}  # topic -> max.message.bytes, where the broker says
        self._producer: _Client | None = None
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
        """The librdkafka properties every producer of this sink is made with (callbacks aside)."""
        return dict(self._config)

    async def connect_until_up(self, topics: Sequence[str], attempt_timeout_s: float = 10.0) -> None:
        """``connect`` again every second until the broker answers (a server keeps serving meanwhile).

        Attempts are short, so a server stopped while Kafka is away need not wait for a long one to give up.
        """
        while True:
            try:
                await asyncio.to_thread(self.connect, topics, attempt_timeout_s)
                log.info("connected to Kafka at %s", self.bootstrap)
                return
            except CollectorError as exc:
                log.warning("%s; retrying in 1s", exc)
                await asyncio.sleep(1.0)

    def connect(self, topics: Sequence[str] = (), timeout_s: float = 10.0) -> None:
        """Create the producer and fetch metadata of ``topics`` (blocking; run it in a thread).

        Until this succeeds ``send`` raises ``SinkUnavailable``, so a collector started before its
        broker answers 503 and recovers on its own. The producer is put in use only once it has
        the topics' metadata from the broker (so the first send does not wait for it).
        """
        self._topics = tuple(dict.fromkeys((*self._topics, *topics)))
        if self._producer is not None:
            self.warm(self._topics, timeout_s)
            return
        try:
            client = _Client(self._config)
        except KafkaException as exc:
            self._state = f"cannot make a Kafka producer for {self.bootstrap}: {exc}"
            raise SinkUnavailable(self._state) from exc
        try:
            self._warm(client, self._topics, timeout_s)
            if client.fatal is not None:
                self._state = f"Kafka at {self.bootstrap} gives no usable producer id: {client.fatal}"
                raise SinkUnavailable(self._state)
        except BaseException:
            _close_now(client)
            raise
        self._read_limits()
        self._producer = client
        self._failure = None
        self._state = ""

    def _read_limits(self) -> None:
        """Learn each topic's max.message.bytes; a broker that will not say leaves ours as the limit."""
        from kafka.errors import KafkaError as AdminError  # topic_limits asks with kafka-python's admin

        try:
            limits = topic_limits(self.settings, self.bootstrap, self._topics)
        except (AdminError, OSError) as exc:
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

    def _warm(self, client: _Client, topics: Sequence[str], timeout_s: float) -> None:
        for topic in topics:
            deadline = time.monotonic() + timeout_s
            while not _has_partitions(client, topic, max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    self._state = f"topic {topic!r} has no partitions on {self.bootstrap}"
                    raise SinkUnavailable(self._state)
                time.sleep(0.1)

    def problem(self) -> str | None:
        """Why a send would not be acknowledged now, in words; None when nothing is known wrong."""
        client = self._producer
        if client is None:
            return self._state or f"not connected to Kafka at {self.bootstrap}"
        reason = self._failure or client.fatal
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
        client = self._producer
        if client is None:
            raise SinkUnavailable(f"{self._state or 'not connected to Kafka'}; retry shortly")
        reason = self._failure or client.fatal
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
        waiter = _Waiter(loop, future, len(records), size, client)
        self.pending_bytes += size
        self._waiters.add(waiter)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch())
        try:
            produce = client.producer.produce
            for r in records:
                try:
                    # confluent-kafka's stub wants list[tuple[str, str | bytes | None]]: a list is invariant
                    produce(r.topic, r.value, r.key, headers=r.headers, on_delivery=waiter.delivered)  # type: ignore[arg-type]
                except BufferError:
                    waiter.failed(SinkBusy("the Kafka producer's queue is full; retry shortly"))
                    break
                except (KafkaException, RuntimeError) as exc:  # too large, fatal, closed producer
                    waiter.failed(exc)
                    break
            try:
                await future
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and err.code() in _TOO_LARGE:
                    # Our check passed, so the topic takes less than we knew: learn its limit for next time.
                    loop.run_in_executor(None, self._read_limits)
                    biggest = max(records, key=record_size)
                    raise _too_large(
                        biggest,
                        record_size(biggest),
                        f"which Kafka refused as too large ({err.name()})",
                        ours,
                        written="traces of this request that Kafka took before it stay written",
                    ) from exc
                self._failed_on(client, exc)
                raise SinkUnavailable(f"Kafka did not acknowledge: {exc}") from exc
            except RuntimeError as exc:
                self._failed_on(client, exc)
                raise SinkUnavailable(f"Kafka did not acknowledge: {exc}") from exc
        finally:
            self._waiters.discard(waiter)
            self.pending_bytes -= size

    # --- recovery ------------------------------------------------------------------------------
    def _failed_on(self, client: _Client, exc: BaseException) -> None:
        """A record given up on (or refused by a fatal producer): this producer's sequence state is
        no longer trustworthy; use a new one."""
        if client is self._producer:
            self._start_recovery(f"{type(exc).__name__}: {exc}")

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
            client = self._producer
            oldest = min((w.started for w in self._waiters if w.producer is client), default=None)
            if client is None or oldest is None or time.monotonic() - oldest < limit:
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
        if self._producer.producer.flush(timeout_s):
            log.warning("Kafka did not acknowledge every buffered record within %.0fs", timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush (at most ``timeout_s``), then close the producer; called on SIGTERM."""
        for task in (self._recovering, self._watchdog):
            if task is not None:
                task.get_loop().call_soon_threadsafe(task.cancel)
        client, self._producer = self._producer, None
        if client is not None and client.close(timeout_s):
            log.warning("Kafka did not acknowledge every buffered record within %.0fs", timeout_s)


def _too_large(record: Record, size: int, limit: str, ours: int, *, written: str) -> RecordTooLarge:
    """The 413 for a trace too big for one Kafka record: which trace, its size, the limit, and what to do."""
    trace = (record.key or b"?").decode("ascii", "replace")
    return RecordTooLarge(
        f"trace {trace} makes a Kafka record of {size} bytes for topic {record.topic!r}, {limit} "
        f"(the smaller of kafka.max_message_bytes = {ours} and the topic's max.message.bytes); {written}. "
        "Send the trace in smaller pieces (the spans of one trace may come in several requests) or raise the limit"
    )


def _has_partitions(client: _Client, topic: str, timeout_s: float) -> bool:
    """True once the broker's metadata (now in the producer's cache) gives ``topic`` partitions."""
    try:
        meta = client.producer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return False
    return meta is not None and meta.error is None and bool(meta.partitions)


def _close_now(client: _Client) -> None:
    """Close without waiting: pending records fail (their senders get 503 and retry elsewhere)."""
    try:
        client.close(0)
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
