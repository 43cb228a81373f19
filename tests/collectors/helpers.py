"""Test helpers: run a CollectorServer in a background thread, read topics back from Kafka, decode a sink."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kafka import KafkaConsumer, TopicPartition
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.receivers import CollectorServer
from collectors.sink import MemorySink, RecordSink
from schemas.config import KafkaSettings, Settings

if TYPE_CHECKING:
    import polars as pl


class LoopThread:
    """An asyncio loop on a daemon thread, for servers the test talks to over sockets."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextmanager
def running_collector(settings: Settings, sink: RecordSink | None = None) -> Iterator[CollectorServer]:
    """A started collector on free ports; stopped (and flushed) on exit."""
    settings.collector.http_port = 0
    settings.collector.grpc_port = 0
    lt = LoopThread()
    server = CollectorServer(settings, sink)
    lt.run(server.start())
    try:
        if sink is None:
            wait_until(lambda: server.sink.connected, 20)  # type: ignore[attr-defined]
        yield server
    finally:
        lt.run(server.stop(), timeout=120)
        lt.close()


def wait_until(cond: Callable[[], bool], timeout: float, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_topic(
    kafka: KafkaSettings, topic: str, *, expect: int | None = None, timeout: float = 15.0, idle: float = 1.5
) -> list[Any]:
    """Every record of ``topic`` from the beginning: until ``expect`` records, or ``idle`` s of quiet."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers.split(","), enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=300)
            for recs in batch.values():
                out.extend(recs)
                last = time.monotonic()
            if expect is not None and len(out) >= expect:
                # keep polling briefly so that extra (duplicate) records would be seen too
                if time.monotonic() - last > 0.5:
                    break
            elif expect is None and time.monotonic() - last > idle:
                break
        return out
    finally:
        consumer.close()


def spans_of(records: list[Any]) -> list[tuple[str, str]]:
    """(trace id hex, span id hex) of every span in span records."""
    out = []
    for r in records:
        req = ExportTraceServiceRequest.FromString(r.value)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                out.extend((s.trace_id.hex(), s.span_id.hex()) for s in ss.spans)
    return out


def headers_of(record: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers}


def span_rows(sink: MemorySink) -> pl.DataFrame:
    """The `spans` rows bronze decodes from what a gateway or collector wrote to ``sink`` (none quarantined)."""
    import polars as pl

    from pipelines.bronze.decoding import KafkaRecord, SpanBatch

    batch = SpanBatch()
    for offset, record in enumerate(sink.records):
        batch.add(KafkaRecord("agentlake.spans.v1", 0, offset, None, record.value, []))
    assert not batch.quarantine, batch.quarantine
    frame = pl.from_arrow(batch.to_table())
    assert isinstance(frame, pl.DataFrame)
    return frame
