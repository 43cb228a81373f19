"""Ingest lag: each partition's end offset, asked of the broker, against the lake's watermark.

The viewer never consumes Kafka: it asks for end offsets only (ListOffsets, through the Kafka sensor's
group-less consumer and its ``end_offsets_hint``; no subscribe, no group, no commit), within a hard deadline,
so a broker that is down or not configured costs a page at most ``timeout_s`` and the page says why.
The arithmetic is the sensor's: the lake's next Kafka offset is ``Position.kafka_start``.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass

from pipelines.bronze.offset_hints import end_offsets_hint, make_consumer
from pipelines.bronze.positions import Position
from schemas.config import KafkaSettings
from viewer.queries.health import TablePosition

_POOL = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="viewer-kafka")


@dataclass(frozen=True)
class BrokerEnds:
    """The broker's end offsets per topic and partition, or why there are none."""

    ends: dict[str, dict[int, int]]
    error: str | None = None  # None: the broker answered


@dataclass(frozen=True)
class PartitionLag:
    """One partition: the broker's end offset, the lake's watermark, and the records between them."""

    table: str
    topic: str
    partition: int
    end: int | None  # None: the broker did not name this partition
    watermark: int | None  # last lake offset held (None: nothing ingested yet)
    next_offset: int  # the Kafka offset ingestion reads next
    lag: int | None  # records in Kafka not in the lake (None: no end offset)


def _ask(kafka: KafkaSettings, topics: list[str], timeout_s: float) -> dict[str, dict[int, int]]:
    ms = max(100, int(timeout_s * 1000))
    consumer = make_consumer(kafka, request_timeout_ms=ms, bootstrap_timeout_ms=ms)
    try:
        return {t: end_offsets_hint(consumer, t) for t in topics}
    finally:
        consumer.close()


def broker_end_offsets(kafka: KafkaSettings, topics: list[str], *, timeout_s: float = 1.0) -> BrokerEnds:
    """End offsets of ``topics`` within ``timeout_s`` (a look-up still running after it is left to finish)."""
    if not kafka.bootstrap_servers.strip():
        return BrokerEnds({}, "no broker configured (kafka.bootstrap_servers)")
    future = _POOL.submit(_ask, kafka, topics, timeout_s)
    try:
        return BrokerEnds(future.result(timeout=timeout_s + 0.5))
    except cf.TimeoutError:
        return BrokerEnds({}, f"the broker at {kafka.bootstrap_servers} did not answer within {timeout_s:g} s")
    except Exception as e:  # noqa: BLE001 -- any client error means the same to the page: no end offsets
        return BrokerEnds({}, f"the broker at {kafka.bootstrap_servers} is unreachable: {type(e).__name__}: {e}")


def lags(positions: list[TablePosition], topics: dict[str, str], ends: dict[str, dict[int, int]]) -> list[PartitionLag]:
    """Each partition the lake or the broker names, per bronze table (``topics``: table -> its topic)."""
    out = []
    for t in positions:
        held = {(p.topic, p.partition): p for p in t.partitions}
        names = {
            (topic, p) for topic in {topics.get(t.table), *(k[0] for k in held)} if topic for p in ends.get(topic, {})
        }
        for topic, part in sorted(names | set(held)):
            pp = held.get((topic, part))
            mark = pp.watermark if pp else None
            nxt = Position(part, mark, pp.base if pp else 0).kafka_start or 0
            end = ends.get(topic, {}).get(part)
            lag = None if end is None else max(0, end - nxt)
            out.append(PartitionLag(t.table, topic, part, end, mark, nxt, lag))
    return out
