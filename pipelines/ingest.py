"""Kafka to bronze Delta tables, exactly once, in bounded batches.

Each topic-partition is an app id (``kafka:<topic>:<partition>``); the last offset written goes into
the same Delta commit as the rows, and a run starts from ``transaction_version + 1``. Consumer
groups are not used at all: ``assign()`` at the offsets the lake holds is both the fast path on
Tansu (a group join takes ~20 s there) and the truth.

Records are fetched with confluent-kafka: librdkafka fetches and parses record batches on its own
threads, off the GIL, while this thread decodes the previous ones (kafka-python parsed them in
Python, about a quarter of ingestion time). A run ends when every partition reports end of
partition (librdkafka compares its position with the high watermark of the last fetch), not after
empty polls. One commit is in flight on a writer thread while the next batch is decoded.

Undecodable records go to `quarantine` first, with their own app transactions, so a crash
between the two commits neither loses nor repeats a quarantined record.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl
import pyarrow as pa

from pipelines.decode import KafkaRecord, decode_reward_event, decode_spans, quarantine_row, reward_rows_from_spans
from pipelines.lake import Lake
from schemas.config import KafkaSettings
from schemas.tables import QUARANTINE, REWARDS

Kind = Literal["spans", "rewards"]


def app_id(topic: str, partition: int) -> str:
    return f"kafka:{topic}:{partition}"


@dataclass
class IngestResult:
    """What one ingestion run did; becomes Dagster materialization metadata."""

    topic: str
    records: int = 0
    rows: int = 0
    quarantined: int = 0
    commits: int = 0
    seconds: float = 0.0
    next_offsets: dict[int, int] = field(default_factory=dict)
    lag: int = 0

    def metadata(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "records": self.records,
            "rows": self.rows,
            "quarantined": self.quarantined,
            "commits": self.commits,
            "lag_records": self.lag,
            "seconds": round(self.seconds, 3),
        }


def make_consumer(kafka: KafkaSettings) -> Any:
    """A kafka-python consumer with no group, for offset look-ups (the sensor's end-offset hints)."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **kafka.client_config(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )


def fetch_config(kafka: KafkaSettings, *, prefetch_mb: int = 64) -> dict[str, Any]:
    """librdkafka settings for ingestion; ``prefetch_mb`` bounds what it buffers ahead of decoding."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol,
        # librdkafka wants a group id; it is never joined (assign() only) and nothing is committed.
        "group.id": "agentlake-ingest",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "max.partition.fetch.bytes": 8 << 20,
        "fetch.max.bytes": 64 << 20,
        "queued.max.messages.kbytes": prefetch_mb << 10,
        "fetch.wait.max.ms": 50,  # an idle partition reports its end after this, not after 500 ms
        "check.crcs": False,
    }
    if kafka.sasl_mechanism:
        cfg.update(
            {
                "sasl.mechanism": kafka.sasl_mechanism,
                "sasl.username": kafka.sasl_username,
                "sasl.password": kafka.sasl_password,
            }
        )
    return cfg


def make_fetcher(kafka: KafkaSettings) -> Any:
    """The confluent-kafka consumer ingestion reads with; positions come from the lake, never from Kafka."""
    from confluent_kafka import Consumer

    return Consumer(fetch_config(kafka))


def end_offsets_hint(consumer: Any, topic: str) -> dict[int, int]:
    """End offsets as the broker reports them; Tansu reports the last batch's base, so a hint only."""
    from kafka import TopicPartition

    parts = consumer.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()} if tps else {}


def _partitions(consumer: Any, topic: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
        time.sleep(0.2)


def _batches(
    consumer: Any, topic: str, starts: dict[int, int | None], batch_records: int, idle_ms: int
) -> Iterator[list[KafkaRecord]]:
    """Bounded batches from the given offsets until every partition has reported its end.

    ``idle_ms`` without any record or event still ends the run, for a broker that never answers.
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if s is None else s) for p, s in starts.items()])
    at_end: set[int] = set()
    idle_since: float | None = None
    while len(at_end) < len(starts):
        batch: list[KafkaRecord] = []
        while len(batch) < batch_records and len(at_end) < len(starts):
            msgs = consumer.consume(num_messages=min(batch_records - len(batch), 1000), timeout=0.05)
            if not msgs:
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                elif (now - idle_since) * 1000 >= idle_ms:
                    at_end.update(starts)
                continue
            idle_since = None
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                        continue
                    raise KafkaException(err)
                ts_type, ts = m.timestamp()
                batch.append(
                    KafkaRecord(
                        topic, m.partition(), m.offset(), m.key(), m.value(), m.headers() or (), ts if ts_type else None
                    )
                )
        if batch:
            yield batch


def _lag(consumer: Any, topic: str, parts: list[int], nexts: dict[int, int]) -> int:
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


def ingest(
    lake: Lake,
    kafka: KafkaSettings,
    kind: Kind,
    *,
    batch_records: int = 2000,
    max_batches: int | None = None,
    idle_ms: int = 300,
    consumer: Any | None = None,
    on_commit: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> IngestResult:
    """Consume ``kind``'s topic from where the lake left off into its table until caught up.

    ``consumer`` is a confluent-kafka consumer to reuse (default: one made and closed here).
    ``workers`` decoder processes (default: ``default_workers``; 0 decodes in this process).
    """
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    result = IngestResult(topic=topic)
    t0 = time.perf_counter()
    n_workers = default_workers(kind) if workers is None else workers
    # Forked before the consumer and writer threads exist, so no child starts with a lock held.
    decoders = _decoder_pool(n_workers) if n_workers > 0 else None
    own = consumer is None
    consumer = consumer or make_fetcher(kafka)
    try:
        parts = _partitions(consumer, topic)
        ids = {p: app_id(topic, p) for p in parts}
        done = lake.txns(kind, list(ids.values()))
        quarantined_upto = lake.txns("quarantine", list(ids.values()))
        starts = {p: (None if done[ids[p]] is None else done[ids[p]] + 1) for p in parts}  # type: ignore[operator]
        nexts = {p: s or 0 for p, s in starts.items()}
        # A pipeline: a batch decodes in slices on the worker processes while this thread fetches
        # the next, and one commit is in flight on a writer thread (delta-rs releases the GIL).
        # Batches are committed in offset order, each after the one before it: exactly-once as before.
        decoding: deque[tuple[list[Future[tuple[pa.Table, list[dict[str, Any]]]]], dict[int, int], int]] = deque()
        pending: tuple[Future[int], dict[int, int], int, int, int] | None = None

        def finish() -> None:
            assert pending is not None
            future, last, records, rows, quarantined = pending
            version = future.result()
            result.records += records
            result.rows += rows
            result.quarantined += quarantined
            result.commits += 1
            for p, off in last.items():
                nexts[p] = off + 1
            if on_commit is not None:
                on_commit(version)

        def commit_oldest() -> None:
            nonlocal pending
            chunks, last, records = decoding.popleft()
            parts_done = [c.result() for c in chunks]
            data = parts_done[0][0] if len(parts_done) == 1 else pa.concat_tables([t for t, _ in parts_done])
            bad = [q for _, qs in parts_done for q in qs]
            txns = {ids[p]: off for p, off in last.items()}
            bad = [
                q
                for q in bad
                if (w := quarantined_upto.get(ids[q["kafka_partition"]])) is None or q["kafka_offset"] > w
            ]
            if bad:
                quarantined_upto.update(txns)
            if pending is not None:
                finish()
            pending = (writer.submit(_commit, lake, kind, data, bad, txns), last, records, data.num_rows, len(bad))

        with ThreadPoolExecutor(1, thread_name_prefix="agentlake-commit") as writer:
            for n, batch in enumerate(_batches(consumer, topic, starts, batch_records, idle_ms)):
                last: dict[int, int] = {}
                for r in batch:
                    last[r.partition] = max(last.get(r.partition, -1), r.offset)
                if decoders is not None:
                    # each worker decodes a slice of the batch; the slices are committed together
                    size = -(-len(batch) // n_workers)
                    chunks = [decoders.submit(_decode, kind, batch[i : i + size]) for i in range(0, len(batch), size)]
                else:
                    done_now: Future[tuple[pa.Table, list[dict[str, Any]]]] = Future()
                    done_now.set_result(_decode(kind, batch))
                    chunks = [done_now]
                decoding.append((chunks, last, len(batch)))
                del batch
                # one batch decoding ahead of the one being committed: memory stays a few batches
                while len(decoding) > (1 if decoders is not None else 0):
                    commit_oldest()
                if max_batches is not None and n + 1 >= max_batches:
                    break
            while decoding:
                commit_oldest()
            if pending is not None:
                finish()
        result.next_offsets = nexts
        result.lag = _lag(consumer, topic, parts, nexts)
    finally:
        if decoders is not None:
            decoders.shutdown(wait=True, cancel_futures=True)
        if own:
            consumer.close()
    result.seconds = time.perf_counter() - t0
    return result


def default_workers(kind: Kind) -> int:
    """Decoder processes worth forking for ``kind``: two on a 2-core machine, one per core left over above that.

    Decoding is Python, so more cores only help from other processes. Handing records over costs
    CPU too (pickling, copy-on-write faults), but much less than it frees: measured on 2 cores
    (``benchmarks/bench_pipelines.py --workers 0`` vs the default), two decoders ingest about 20%
    more spans/s than decoding in process, three no more than two. Reward events are small JSON
    records: always decoded in process.
    """
    cpus = os.cpu_count() or 1
    if kind != "spans" or cpus < 2:
        return 0
    return min(4, max(2, cpus - 1))


def _decoder_init() -> None:
    """A decoder dies with its parent, even one killed with SIGKILL (Linux), instead of lingering."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _decoder_pool(workers: int) -> ProcessPoolExecutor:
    """Decoder processes, forked now (fork: nothing to re-import, so a run pays milliseconds)."""
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_decoder_init)
    pool.submit(int).result()  # with fork, the first submit starts every worker
    return pool


def _commit(lake: Lake, kind: Kind, data: pa.Table, bad: list[dict[str, Any]], txns: dict[str, int]) -> int:
    """Quarantine first, then the rows, each commit carrying the batch's offsets; the new version."""
    if bad:
        lake.write("quarantine", pa.Table.from_pylist(bad, schema=QUARANTINE), txns=txns)
    return lake.write(kind, data, txns=txns)


def _decode(kind: Kind, batch: list[KafkaRecord]) -> tuple[pa.Table, list[dict[str, Any]]]:
    if kind == "spans":
        return decode_spans(batch)
    rows: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for rec in batch:
        try:
            rows.append(decode_reward_event(rec))
        except Exception as exc:  # noqa: BLE001 - quarantined with the message, never fatal
            bad.append(quarantine_row(rec, f"{type(exc).__name__}: {exc}"))
    return pa.Table.from_pylist(rows, schema=REWARDS), bad


def span_rewards_app_id(topic: str, partition: int) -> str:
    return f"spans:{topic}:{partition}"


def extract_span_rewards(lake: Lake, spans_topic: str) -> int:
    """Copy reward spans from `spans` into `rewards`, exactly once per spans partition offset."""
    spans = lake.table("spans")
    if spans is None:
        return 0
    parts = sorted(
        {int(p) for p in pl.scan_delta(spans).select("kafka_partition").unique().collect()["kafka_partition"]}
    )
    upto = {p: spans.transaction_version(app_id(spans_topic, p)) for p in parts}
    done = lake.txns("rewards", [span_rewards_app_id(spans_topic, p) for p in parts])
    cond = pl.lit(False)
    txns: dict[str, int] = {}
    for p in parts:
        hi = upto[p]
        lo = done[span_rewards_app_id(spans_topic, p)]
        if hi is None or (lo is not None and lo >= hi):
            continue
        txns[span_rewards_app_id(spans_topic, p)] = hi
        part = (pl.col("kafka_partition") == p) & (pl.col("kafka_offset") <= hi)
        if lo is not None:
            part = part & (pl.col("kafka_offset") > lo)
        cond = cond | part
    if not txns:
        return 0
    rows = (
        pl.scan_delta(spans)
        .filter(pl.col("kafka_topic") == spans_topic)
        .filter(pl.col("reward_value").is_not_null())
        .filter(cond)
        .collect()
        .to_arrow()
    )
    data = reward_rows_from_spans(rows)
    lake.write("rewards", data, txns=txns)
    return data.num_rows
