"""Records from Kafka with confluent-kafka, in bounded batches, from the offsets the lake holds.

librdkafka fetches and parses record batches on its own threads, off the GIL, while the caller
decodes the previous ones (kafka-python parsed them in Python, about a quarter of ingestion time).
Consumer groups are not used at all: ``assign()`` at the offsets the lake holds is both the fast
path on Tansu (a group join takes ~20 s there) and the truth. A run ends when every partition
reports end of partition (librdkafka compares its position with the high watermark of the last
fetch), not after empty polls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pipelines.bronze.decoding import KafkaRecord
from pipelines.bronze.positions import record_fingerprint
from schemas.config import KafkaSettings
from schemas.kafka import librdkafka_config


def fetch_config(kafka: KafkaSettings, *, prefetch_mb: int = 64) -> dict[str, Any]:
    """librdkafka settings for ingestion; ``prefetch_mb`` bounds what it buffers ahead of decoding.

    Servers, security, CRC checks and size limits come from ``schemas.kafka.librdkafka_config``.
    """
    cfg = librdkafka_config(kafka, role="consumer")
    fetch = max(64 << 20, cfg["fetch.max.bytes"])
    cfg.update(
        {
            # librdkafka wants a group id; it is never joined (assign() only) and nothing is committed.
            "group.id": "agentlake-ingest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "max.partition.fetch.bytes": max(8 << 20, cfg["max.partition.fetch.bytes"]),
            "fetch.max.bytes": fetch,
            "receive.message.max.bytes": fetch + (1 << 20),
            "queued.max.messages.kbytes": prefetch_mb << 10,
            "fetch.wait.max.ms": 50,  # an idle partition reports its end after this, not after 500 ms
        }
    )
    return cfg


def make_fetcher(kafka: KafkaSettings) -> Any:
    """The confluent-kafka consumer ingestion reads with; positions come from the lake, never from Kafka."""
    from confluent_kafka import Consumer

    return Consumer(fetch_config(kafka))


def topic_partitions(consumer: Any, topic: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
        time.sleep(0.2)


STALL_MS = 10_000
"""How long a run waits through silence while the broker still owes it records."""


def batches(
    consumer: Any,
    topic: str,
    starts: dict[int, int | None],
    batch_records: int,
    idle_ms: int,
    bases: dict[int, int] | None = None,
    *,
    stall_ms: int = STALL_MS,
    verify: dict[int, tuple[int, int]] | None = None,
    verify_ms: int = 1_000,
) -> Iterator[list[KafkaRecord]]:
    """Bounded batches from the given Kafka offsets until every partition has reported its end.

    Records carry lake offsets: the Kafka offset plus the partition's base (``bases``).
    ``idle_ms`` without any record or event still ends the run, for a broker that never sends the end
    of a partition; but while the broker owes records (a partition has not answered yet, or its last
    fetch showed records past the position) the run waits up to ``stall_ms``: a busy broker's answers
    can take longer than ``idle_ms``, and ending then left whole partitions unread (8 workers on 8
    partitions ingested 66-88% of the backlog).

    ``verify``: per partition, the lake offset and fingerprint of the record at the lake's watermark.
    Those partitions are read from that record rather than the one after it: it is compared and
    dropped, and no batch is yielded before every one of them matched. So the check that the log
    still holds what the lake read (`pipelines.bronze.log_reset`) costs no fetch of its own, which
    would fetch the increment twice. A partition whose first record is another, whose end comes
    first, or that sends nothing within ``verify_ms`` raises ``LogNotVerified`` before any batch:
    the caller then checks the log the slow way and reads again.
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

    base = bases or {}
    expected = verify or {}
    unverified = set(expected)
    seek = {p: expected[p][0] - base.get(p, 0) if p in expected else s for p, s in starts.items()}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if s is None else s) for p, s in seek.items()])
    at_end: set[int] = set()
    began = time.monotonic()
    idle_since: float | None = began
    while len(at_end) < len(starts):
        batch: list[KafkaRecord] = []
        while (len(batch) < batch_records or unverified) and len(at_end) < len(starts):
            if unverified and (time.monotonic() - began) * 1000 >= verify_ms:
                raise LogNotVerified(sorted(unverified), "sent no record within the wait")
            msgs = consumer.consume(num_messages=min(max(batch_records - len(batch), 1), 1000), timeout=0.05)
            if not msgs:
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                silent_ms = (now - idle_since) * 1000
                if silent_ms >= idle_ms and (
                    silent_ms >= stall_ms or not owed(consumer, topic, [p for p in starts if p not in at_end])
                ):
                    at_end.update(starts)
                continue
            idle_since = None
            for m in msgs:
                err = m.error()
                p = m.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(p)
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET and p in unverified:  # Kafka: past the log's end
                        raise LogNotVerified([p], "has no record at the watermark (offset out of range)")
                    raise KafkaException(err)
                ts_type, ts = m.timestamp()
                offset = m.offset() + base.get(p, 0)
                rec = KafkaRecord(topic, p, offset, m.key(), m.value(), m.headers() or (), ts if ts_type else None)
                if p in unverified:
                    if (rec.offset, record_fingerprint(rec)) != expected[p]:
                        raise LogNotVerified([p], f"sent offset {m.offset()} first, not the watermark's record")
                    unverified.discard(p)
                    continue
                batch.append(rec)
        if unverified:
            raise LogNotVerified(sorted(unverified), "ended before the watermark's record")
        # held while the watermarks were checked, a first batch can be several: yielded in bounded slices,
        # which keep each partition's order, so the caller decodes one while it commits the one before
        for i in range(0, len(batch), batch_records):
            yield batch[i : i + batch_records]


class LogNotVerified(Exception):
    """``batches(verify=...)`` did not find the record at a partition's watermark first; nothing was yielded."""

    def __init__(self, partitions: list[int], why: str) -> None:
        super().__init__(f"partitions {partitions}: {why}")
        self.partitions = partitions


def owed(consumer: Any, topic: str, parts: list[int]) -> bool:
    """Whether the broker owes any of ``parts`` records, as far as the last fetches tell: a partition
    that has not answered yet, or one whose high watermark is past the consumer's position."""
    from confluent_kafka import TopicPartition

    for p in parts:
        _, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        [at] = consumer.position([TopicPartition(topic, p)])
        if hi < 0 or at.offset < hi:  # no position yet (a negative offset) is below any watermark
            return True
    return False


def records_behind(consumer: Any, topic: str, parts: list[int], nexts: dict[int, int]) -> int:
    """Records left behind, from the high watermarks of the last fetches (else asked of the broker)."""
    from confluent_kafka import KafkaException, TopicPartition

    lag = 0
    for p in parts:
        _, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        if hi < 0:
            try:
                _, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
            except KafkaException:  # a hint only: never fail a run that committed its batches
                continue
        lag += max(0, hi - nexts.get(p, 0))
    return lag
