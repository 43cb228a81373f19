"""Kafka to bronze Delta tables, exactly once, in bounded batches.

Each topic-partition is an app id (``kafka:<topic>:<partition>``); the last offset written goes into
the same Delta commit as the rows, and a run starts from ``transaction_version + 1``. Consumer
groups are not used at all: ``assign()`` + ``seek()`` to the offsets the lake holds is both the
fast path on Tansu (a group join takes ~20 s there) and the truth.

Undecodable records go to `quarantine` first, with their own app transactions, so a crash
between the two commits neither loses nor repeats a quarantined record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl
import pyarrow as pa

from pipelines.decode import KafkaRecord, SpanBatch, decode_reward_event, quarantine_row, reward_rows_from_spans
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
    """A kafka-python consumer with no group: positions come from the lake, never from Kafka."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **client_config(kafka),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
        check_crcs=False,
        consumer_timeout_ms=1000,
    )


def client_config(kafka: KafkaSettings) -> dict[str, Any]:
    """kafka-python connection arguments from the settings (same as the collector's)."""
    cfg: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers.split(","),
        "security_protocol": kafka.security_protocol,
    }
    if kafka.sasl_mechanism:
        cfg.update(
            sasl_mechanism=kafka.sasl_mechanism,
            sasl_plain_username=kafka.sasl_username,
            sasl_plain_password=kafka.sasl_password,
        )
    return cfg


def end_offsets_hint(consumer: Any, topic: str) -> dict[int, int]:
    """End offsets as the broker reports them; Tansu reports the last batch's base, so a hint only."""
    from kafka import TopicPartition

    parts = consumer.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()} if tps else {}


def _partitions(consumer: Any, topic: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
        consumer.topics()  # forces a metadata refresh
        time.sleep(0.2)


def _batches(
    consumer: Any, topic: str, starts: dict[int, int | None], batch_records: int, idle_ms: int
) -> Iterator[list[KafkaRecord]]:
    """Bounded batches from the given offsets until the partitions stop yielding records."""
    from kafka import TopicPartition

    tps = {p: TopicPartition(topic, p) for p in starts}
    consumer.assign(list(tps.values()))
    begin = consumer.beginning_offsets(list(tps.values()))
    for p, tp in tps.items():
        start = starts[p]
        consumer.seek(tp, max(start, begin[tp]) if start is not None else begin[tp])
    empty = 0
    while True:
        batch: list[KafkaRecord] = []
        while len(batch) < batch_records:
            polled = consumer.poll(timeout_ms=idle_ms, max_records=batch_records - len(batch))
            if not polled:
                empty += 1
                break
            empty = 0
            for msgs in polled.values():
                for m in msgs:
                    batch.append(KafkaRecord(m.topic, m.partition, m.offset, m.key, m.value, m.headers, m.timestamp))
        if batch:
            yield batch
        elif empty >= 2:
            return


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
) -> IngestResult:
    """Consume ``kind``'s topic from where the lake left off into its table until caught up."""
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    own = consumer is None
    consumer = consumer or make_consumer(kafka)
    result = IngestResult(topic=topic)
    t0 = time.perf_counter()
    try:
        parts = _partitions(consumer, topic)
        ids = {p: app_id(topic, p) for p in parts}
        done = lake.txns(kind, list(ids.values()))
        quarantined_upto = lake.txns("quarantine", list(ids.values()))
        starts = {p: (None if done[ids[p]] is None else done[ids[p]] + 1) for p in parts}  # type: ignore[operator]
        nexts = {p: s or 0 for p, s in starts.items()}
        for n, batch in enumerate(_batches(consumer, topic, starts, batch_records, idle_ms)):
            last: dict[int, int] = {}
            for r in batch:
                last[r.partition] = max(last.get(r.partition, -1), r.offset)
            txns = {ids[p]: off for p, off in last.items()}
            data, bad = _decode(kind, batch)
            bad = [
                q
                for q in bad
                if (w := quarantined_upto.get(ids[q["kafka_partition"]])) is None or q["kafka_offset"] > w
            ]
            if bad:
                lake.write("quarantine", pa.Table.from_pylist(bad, schema=QUARANTINE), txns=txns)
                quarantined_upto.update(txns)
            version = lake.write(kind, data, txns=txns)
            result.records += len(batch)
            result.rows += data.num_rows
            result.quarantined += len(bad)
            result.commits += 1
            for p, off in last.items():
                nexts[p] = off + 1
            if on_commit is not None:
                on_commit(version)
            if max_batches is not None and n + 1 >= max_batches:
                break
        result.next_offsets = nexts
        hint = end_offsets_hint(consumer, topic)
        result.lag = sum(max(0, hint.get(p, 0) - nexts.get(p, 0)) for p in parts)
    finally:
        if own:
            consumer.close()
    result.seconds = time.perf_counter() - t0
    return result


def _decode(kind: Kind, batch: list[KafkaRecord]) -> tuple[pa.Table, list[dict[str, Any]]]:
    if kind == "spans":
        sb = SpanBatch()
        for rec in batch:
            sb.add(rec)
        return sb.to_table(), sb.quarantine
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
