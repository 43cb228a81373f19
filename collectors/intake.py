"""The receiver logic shared by OTLP/HTTP, OTLP/gRPC and /v1/rewards: auth, decode, deliver.

Decoding runs on worker threads, never on the event loop: one 16 MB body takes seconds to
decompress, parse, check and split, and every other client, ``/health`` included, would wait that
long. The process has ``DECODE_WORKERS`` such threads: a body decodes on one of them, at most that
many at once, the others queue. (A plain executor: anyio's to_thread cost 3 ms a request here.)

What a trace export gets (OTLP semantics): a body that cannot be decoded, or whose every span is
refused, is a 400 naming the field; a body with some refused spans stores the others and answers
200 with ``partial_success`` (how many, and why the first few were refused). A span is refused when
``schemas.span_checks`` finds it unusable, so nothing acknowledged is quarantined later.

Delivery is idempotent per request body. OTel exporters retry a failed export with the very same
bytes; if our first attempt timed out towards the client but Kafka later acknowledged it, the
retry must not write the spans again. So each body (per tenant and topic) is hashed: a retry
joins the delivery still in flight, or is answered at once when that delivery already succeeded
within ``dedupe_ttl_s``. A delivery that failed is forgotten, and the retry produces again.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from collectors.errors import BadRequest, CollectorError, RecordTooLarge, SinkUnavailable, Unauthorized
from collectors.records import (
    BodyFormat,
    Record,
    TraceSplit,
    decode_traces,
    decompress,
    mentions_checked_keys,
    reward_records,
    split_traces,
)
from collectors.sink import RecordSink
from schemas.config import CollectorSettings, KafkaSettings
from schemas.gc_pause import gc_paused
from schemas.topics import DEFAULT_TENANT

log = logging.getLogger(__name__)

T = TypeVar("T")
DECODE_WORKERS = 2  # the GIL makes more threads no faster; two keep one big body from delaying all others
_DECODERS = ThreadPoolExecutor(max_workers=DECODE_WORKERS, thread_name_prefix="collector-decode")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None (the collector's and gateway's rule)."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


@dataclass
class Stats:
    """Counters a health endpoint and tests can read."""

    requests: int = 0
    acknowledged_spans: int = 0
    rejected_spans: int = 0
    acknowledged_rewards: int = 0
    stored_spans: int = 0  # acknowledged and written by this request (not a retry of a stored body)
    stored_rewards: int = 0
    retried_duplicates: int = 0
    failures: int = 0


def _paused(fn: Callable[..., T], *args: object) -> T:
    with gc_paused():
        return fn(*args)


class Collector:
    """Turns request bodies into acknowledged Kafka records; raises ``CollectorError`` otherwise."""

    def __init__(
        self,
        sink: RecordSink,
        collector: CollectorSettings,
        kafka: KafkaSettings,
        *,
        dedupe_ttl_s: float = 900.0,
        dedupe_capacity: int = 200_000,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.sink = sink
        self.settings = collector
        self.spans_topic = kafka.spans_topic
        self.rewards_topic = kafka.rewards_topic
        self.stats = Stats()
        self._clock = clock
        self._ttl_ns = int(dedupe_ttl_s * 1e9)
        self._capacity = dedupe_capacity
        self._pending: dict[bytes, asyncio.Future[None]] = {}
        self._done: OrderedDict[bytes, int] = OrderedDict()

    # --- auth ------------------------------------------------------------------------------------
    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of a ``Bearer`` token; ``Unauthorized`` when auth is on and it is unknown."""
        token = bearer_token(authorization)
        tenant = self.settings.auth_tokens.get(token) if token else None
        if tenant is not None:
            return tenant
        if self.settings.require_auth:
            if token is None:
                raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
            raise Unauthorized("unknown bearer token: ask the operator for a token in collector.auth_tokens")
        return DEFAULT_TENANT

    # --- endpoints -----------------------------------------------------------------------------------
    async def export_traces(
        self, body: bytes, *, fmt: BodyFormat, tenant: str, encoding: str | None = None
    ) -> TraceSplit:
        """Decode (off the event loop), split per trace and deliver; returns the split (for partial_success).

        ``body`` is as received; ``encoding`` is its Content-Encoding (gzip is undone on the worker).
        """
        self.stats.requests += 1
        key, split = await self._off_loop(self._prepare_traces, body, fmt, tenant, encoding, self._clock())
        self.stats.rejected_spans += split.rejected_spans
        if split.rejected_spans and not split.accepted_spans:
            raise BadRequest(f"every span was refused: {split.error_message}")
        if split.records and await self._deliver(key, split.records):
            self.stats.stored_spans += split.accepted_spans
        self.stats.acknowledged_spans += split.accepted_spans
        return split

    async def post_rewards(self, body: bytes, *, tenant: str, encoding: str | None = None) -> int:
        """Validate (off the event loop) and deliver reward events; returns how many were acknowledged."""
        self.stats.requests += 1
        key, records = await self._off_loop(self._prepare_rewards, body, tenant, encoding, self._clock())
        if await self._deliver(key, records):
            self.stats.stored_rewards += len(records)
        self.stats.acknowledged_rewards += len(records)
        return len(records)

    # --- decoding, on a worker thread ------------------------------------------------------------
    @staticmethod
    async def _off_loop(fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on a decode thread; the event loop serves other requests meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(_DECODERS, functools.partial(_paused, fn, *args))

    def _prepare_traces(
        self, body: bytes, fmt: BodyFormat, tenant: str, encoding: str | None, received_at_ns: int
    ) -> tuple[bytes, TraceSplit]:
        body = decompress(body, encoding, limit=self.settings.max_body_bytes)
        split = split_traces(
            decode_traces(body, fmt),
            tenant=tenant,
            topic=self.spans_topic,
            received_at_ns=received_at_ns,
            original=body if fmt == "protobuf" else None,
            strict=True,
            check_attributes=mentions_checked_keys(body),
        )
        return self._key(tenant, self.spans_topic, body), split

    def _prepare_rewards(
        self, body: bytes, tenant: str, encoding: str | None, received_at_ns: int
    ) -> tuple[bytes, list[Record]]:
        body = decompress(body, encoding, limit=self.settings.max_body_bytes)
        records = reward_records(body, tenant=tenant, topic=self.rewards_topic, received_at_ns=received_at_ns)
        return self._key(tenant, self.rewards_topic, body), records

    # --- idempotent delivery -------------------------------------------------------------------
    @staticmethod
    def _key(tenant: str, topic: str, body: bytes) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        h.update(tenant.encode())
        h.update(b"\0")
        h.update(topic.encode())
        h.update(b"\0")
        h.update(body)
        return h.digest()

    def _seen(self, key: bytes) -> bool:
        at = self._done.get(key)
        if at is None:
            return False
        if self._clock() - at > self._ttl_ns:
            del self._done[key]
            return False
        return True

    async def _deliver(self, key: bytes, records: Sequence[Record]) -> bool:
        """Return once ``records`` are acknowledged: True if this call wrote them, False for a retry."""
        if self._seen(key):
            self.stats.retried_duplicates += 1
            return False
        task = self._pending.get(key)
        fresh = task is None
        if task is None:
            task = asyncio.ensure_future(self.sink.send(records))
            self._pending[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        else:
            self.stats.retried_duplicates += 1
        try:
            await asyncio.wait_for(asyncio.shield(task), self.settings.produce_timeout_s)
        except TimeoutError as exc:
            self.stats.failures += 1
            raise SinkUnavailable(
                f"Kafka did not acknowledge within {self.settings.produce_timeout_s:.1f}s; retry later"
            ) from exc
        except RecordTooLarge as exc:  # the sender is told (413); the operator is too, with the trace id
            self.stats.failures += 1
            log.warning("refused with 413: %s", exc)
            raise
        except CollectorError:
            self.stats.failures += 1
            raise
        except Exception as exc:  # a sink bug must still look retryable, never lose data silently
            self.stats.failures += 1
            log.exception("sink failed")
            raise SinkUnavailable(f"record store failed: {exc}") from exc
        return fresh

    def _finished(self, key: bytes, task: asyncio.Future[None]) -> None:
        self._pending.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        self._done[key] = self._clock()
        while len(self._done) > self._capacity:
            self._done.popitem(last=False)
