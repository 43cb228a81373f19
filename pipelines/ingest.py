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

Exactly once, also with two runs at once: a run reads the positions from one Delta snapshot and
commits every batch on top of it (``Lake.write(snapshot=..., expect=...)``), so a run whose
partitions another run committed first fails before its rows land (``ConcurrentWriteError``).

A log that went back (a broker that lost its log, a recreated topic: offsets restart at 0) is
detected, never skipped: each commit also records a fingerprint of the record at the watermark
(``kafka-fp:<topic>:<partition>``), and a run first reads that record back and compares. A
missing or different record stops the run (``LogResetError``) until the new log is accepted
(``agentlake lake accept-reset``, or ``ingest(on_reset="accept")``): that commits a new epoch
(``kafka-epoch:<topic>``) and, per reset partition, a base (``kafka-base:<topic>:<partition>``,
one past the last offset the lake holds), and records of the new log are stored at offset + base.
So ``kafka_offset`` in the tables is the lake's position in a partition: the Kafka offset until a
reset is accepted, the Kafka offset + base after. It only grows, and the watermarks with it, so
every downstream offset range (``kafka_offset`` between two watermarks) stays correct.

Span text is redacted before it is stored (``pipelines.redact``, the ``[redaction]`` settings the
caller passes, else this process's): each decoded batch, in the decoder process that decoded it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
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

from pipelines.decoding import KafkaRecord, decode_reward_event, decode_spans, quarantine_row, reward_rows_from_spans
from pipelines.redact import Redactor, redact_spans
from schemas.config import KafkaSettings, RedactionSettings
from schemas.errors import LakeError, LogResetError
from schemas.lake import Lake, unseen_offsets
from schemas.tables import QUARANTINE, REWARDS, TABLES

Kind = Literal["spans", "rewards"]
OnReset = Literal["stop", "accept"]

ACCEPT_RESET_HINT = (
    "Nothing was written. To ingest the broker's new log from its first record, run "
    "`agentlake lake accept-reset` (it records a new epoch in the table's history; records "
    "already in the lake stay); to keep waiting for the old log instead, restore the broker's log"
)


def app_id(topic: str, partition: int) -> str:
    """The watermark: the last lake offset of ``partition`` in the table (see the module doc)."""
    return f"kafka:{topic}:{partition}"


def fingerprint_id(topic: str, partition: int) -> str:
    """The fingerprint of the record at the watermark, committed with it."""
    return f"kafka-fp:{topic}:{partition}"


def base_id(topic: str, partition: int) -> str:
    """The lake offset of offset 0 of the partition's current log (absent: 0)."""
    return f"kafka-base:{topic}:{partition}"


def epoch_id(topic: str) -> str:
    """How many log resets of ``topic`` the table has accepted (absent: 0)."""
    return f"kafka-epoch:{topic}"


def record_fingerprint(rec: KafkaRecord) -> int:
    """A 63-bit hash of the record's timestamp, key, value and headers (a valid Delta txn version)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(rec.timestamp_ms).encode())
    for part in (rec.key, rec.value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    for k, v in rec.headers:
        kb = k.encode()
        h.update(len(kb).to_bytes(8, "big") + kb)
        h.update(b"\x00" if v is None else b"\x01" + len(v).to_bytes(8, "big") + v)
    return int.from_bytes(h.digest(), "big") >> 1


@dataclass(frozen=True)
class Position:
    """Where the lake is in one partition: its watermark, the current log's base and fingerprint."""

    partition: int
    watermark: int | None  # last lake offset held (None: nothing yet)
    base: int = 0  # lake offset of Kafka offset 0 in the current log
    fingerprint: int | None = None  # of the record at the watermark (None: a lake from before them)

    @property
    def kafka_start(self) -> int | None:
        """The Kafka offset to read from (None: the log's beginning)."""
        return None if self.watermark is None else max(0, self.watermark + 1 - self.base)

    @property
    def kafka_last(self) -> int | None:
        """The Kafka offset of the record at the watermark, when it is in the current log."""
        if self.watermark is None or self.watermark < self.base:
            return None
        return self.watermark - self.base


def positions(dt: Any, topic: str, parts: list[int]) -> tuple[int, dict[int, Position]]:
    """The topic's epoch and each partition's position, as the Delta snapshot ``dt`` holds them."""
    if dt is None:
        return 0, {p: Position(p, None) for p in parts}
    epoch = dt.transaction_version(epoch_id(topic)) or 0
    return epoch, {
        p: Position(
            p,
            dt.transaction_version(app_id(topic, p)),
            dt.transaction_version(base_id(topic, p)) or 0,
            dt.transaction_version(fingerprint_id(topic, p)),
        )
        for p in parts
    }


@dataclass
class IngestResult:
    """What one ingestion run did; becomes Dagster materialization metadata."""

    topic: str
    records: int = 0
    rows: int = 0
    quarantined: int = 0
    commits: int = 0
    seconds: float = 0.0
    next_offsets: dict[int, int] = field(default_factory=dict)  # Kafka offsets, as the broker numbers them
    lag: int = 0
    epoch: int = 0  # log resets of the topic the table has accepted

    def metadata(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "records": self.records,
            "rows": self.rows,
            "quarantined": self.quarantined,
            "commits": self.commits,
            "lag_records": self.lag,
            "epoch": self.epoch,
            "seconds": round(self.seconds, 3),
        }


def make_consumer(kafka: KafkaSettings) -> Any:
    """A kafka-python consumer with no group, for offset look-ups (the sensor's end-offset hints)."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **kafka.client_config(role="consumer"),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )


def fetch_config(kafka: KafkaSettings, *, prefetch_mb: int = 64) -> dict[str, Any]:
    """librdkafka settings for ingestion; ``prefetch_mb`` bounds what it buffers ahead of decoding.

    Servers, security, CRC checks and size limits come from ``KafkaSettings.librdkafka_config``.
    """
    cfg = kafka.librdkafka_config(role="consumer")
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
    consumer: Any,
    topic: str,
    starts: dict[int, int | None],
    batch_records: int,
    idle_ms: int,
    bases: dict[int, int] | None = None,
) -> Iterator[list[KafkaRecord]]:
    """Bounded batches from the given Kafka offsets until every partition has reported its end.

    Records carry lake offsets: the Kafka offset plus the partition's base (``bases``).
    ``idle_ms`` without any record or event still ends the run, for a broker that never answers.
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

    base = bases or {}
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
                p = m.partition()
                batch.append(
                    KafkaRecord(
                        topic,
                        p,
                        m.offset() + base.get(p, 0),
                        m.key(),
                        m.value(),
                        m.headers() or (),
                        ts if ts_type else None,
                    )
                )
        if batch:
            yield batch


Probe = tuple[Literal["record"], KafkaRecord] | tuple[Literal["end"], int]


def _probe(
    consumer: Any, topic: str, seeks: dict[int, int | None], targets: dict[int, int], timeout_s: float
) -> dict[int, Probe]:
    """Per partition, read from ``seeks`` (None: the beginning) to the first record at or after ``targets``.

    Gives ``("record", rec)`` (Kafka offsets) or ``("end", next_offset)`` when the log ends first;
    a partition that answered neither within ``timeout_s`` is left out. Tansu answers a fetch past
    its log's end with nothing at all, Kafka with out-of-range (librdkafka then restarts from the
    earliest record, which this reads through to the end).
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if s is None else s) for p, s in seeks.items()])
    found: dict[int, Probe] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < len(seeks) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=500, timeout=0.1):
                p = m.partition()
                if p in found or p not in seeks:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        found[p] = ("end", m.offset())
                    elif err.code() != KafkaError._AUTO_OFFSET_RESET:  # reported before the restart
                        raise KafkaException(err)
                    continue
                if m.offset() >= targets[p]:
                    ts_type, ts = m.timestamp()
                    rec = KafkaRecord(
                        topic, p, m.offset(), m.key(), m.value(), m.headers() or (), ts if ts_type else None
                    )
                    found[p] = ("record", rec)
    finally:
        consumer.unassign()
    return found


def check_log(
    consumer: Any,
    topic: str,
    pos: dict[int, Position],
    *,
    legacy: Callable[[KafkaRecord, Position], bool] | None = None,
    timeout_s: float = 5.0,
) -> dict[int, str]:
    """Partitions whose log no longer holds the record at the lake's watermark, each with what the broker has.

    The record at each watermark is read back and compared with the fingerprint committed with
    the watermark (``legacy`` compares it with the rows instead, for watermarks from before
    fingerprints). Raises ``LakeError`` when the broker answers nothing at all for a partition.
    """
    targets = {p: k for p, x in pos.items() if (k := x.kafka_last) is not None}
    if not targets:
        return {}
    # A healthy broker answers within a fetch wait; past the end of a shorter log Tansu answers
    # nothing, so a silent partition is read from its beginning up to the watermark (which a slow
    # broker that does hold it also gets to, later).
    found = _probe(consumer, topic, dict(targets), targets, min(1.0, timeout_s))
    silent = {p: k for p, k in targets.items() if p not in found}
    if silent:
        found.update(_probe(consumer, topic, dict.fromkeys(silent), silent, timeout_s))
    problems: dict[int, str] = {}
    for p, k in targets.items():
        x = pos[p]
        where = f"partition {p}: the lake holds offsets up to {x.watermark}" + (
            f" (Kafka offset {k} of this log)" if x.base else ""
        )
        got = found.get(p)
        if got is None:
            raise LakeError(
                f"{topic} {where}, and the broker returned neither that record nor the end of the log "
                f"within {timeout_s:.0f}s; is it up? Nothing was written"
            )
        if got[0] == "end":
            end = got[1]
            has = "is empty" if end == 0 else f"ends at offset {end - 1}"
            problems[p] = f"{where}, the broker's log {has}"
            continue
        rec = got[1]
        if rec.offset > k:
            problems[p] = f"{where}, the broker's log has no offset {k} (its next record is at {rec.offset})"
            continue
        lake_rec = rec._replace(offset=rec.offset + x.base)
        same = (
            record_fingerprint(rec) == x.fingerprint
            if x.fingerprint is not None
            else legacy is None or legacy(lake_rec, x)
        )
        if not same:
            when = f" written at {rec.timestamp_ms} ms" if rec.timestamp_ms is not None else ""
            problems[p] = f"{where}, the broker has a different record at offset {k}{when}"
    return problems


def _legacy_match(lake: Lake, kind: Kind, data_dt: Any) -> Callable[[KafkaRecord, Position], bool]:
    """Compare a record with the rows the lake holds for its offset (watermarks without a fingerprint)."""

    def match(rec: KafkaRecord, _: Position) -> bool:
        rows, bad = _decode(kind, [rec])
        at = (
            (pl.col("kafka_topic") == rec.topic)
            & (pl.col("kafka_partition") == rec.partition)
            & (pl.col("kafka_offset") == rec.offset)
        )
        q = lake.scan("quarantine")
        held_bad = [] if q is None else q.filter(at).select("value").collect()["value"].to_list()
        if bad:
            return rec.value in held_bad
        cols = ["trace_id", "span_id"] if kind == "spans" else ["reward_id", "value"]
        held = pl.scan_delta(data_dt).filter(at).select(cols).collect().sort(cols)
        new = pl.from_arrow(rows.select(cols))
        assert isinstance(new, pl.DataFrame)
        return held.equals(new.sort(cols)) and not held_bad

    return match


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
    on_reset: OnReset = "stop",
    redaction: RedactionSettings | None = None,
) -> IngestResult:
    """Consume ``kind``'s topic from where the lake left off into its table until caught up.

    ``consumer`` is a confluent-kafka consumer to reuse (default: one made and closed here).
    ``workers`` decoder processes (default: ``default_workers``; 0 decodes in this process).
    ``on_reset``: when a partition's log no longer holds the record at the lake's watermark,
    ``"stop"`` raises ``LogResetError`` before writing anything; ``"accept"`` records a new epoch
    (as ``agentlake lake accept-reset`` does) and ingests the new log from its first record.
    Another run committing the same partitions first makes this one raise ``ConcurrentWriteError``.
    ``redaction``: what span text is redacted before it is stored (default: ``load_settings().redaction``,
    read once here; the decoder processes get it when they are forked).
    """
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    result = IngestResult(topic=topic)
    t0 = time.perf_counter()
    n_workers = default_workers(kind) if workers is None else workers
    redactor = _redactor(redaction) if kind == "spans" else None
    # Forked before the consumer and writer threads exist, so no child starts with a lock held.
    decoders = _decoder_pool(n_workers, redactor) if n_workers > 0 else None
    own = consumer is None
    consumer = consumer or make_fetcher(kafka)
    try:
        parts = _partitions(consumer, topic)
        ids = {p: app_id(topic, p) for p in parts}
        # One snapshot for the whole run: the positions are read from it and every batch commits on
        # top of it (and then on top of this run's previous commit), never on a newer one.
        data_dt = lake.pin(kind)
        epoch, pos = positions(data_dt, topic, parts)
        problems = check_log(consumer, topic, pos, legacy=_legacy_match(lake, kind, data_dt))
        if problems:
            if on_reset != "accept":
                raise LogResetError(topic, [problems[p] for p in sorted(problems)], ACCEPT_RESET_HINT)
            _accept(lake, kind, topic, data_dt, pos, problems, epoch)
            epoch, pos = positions(data_dt, topic, parts)
        result.epoch = epoch
        q_dt: list[Any] = [lake.table("quarantine")]  # pinned at its first use when it does not exist yet
        quarantined_upto = {a: None if q_dt[0] is None else q_dt[0].transaction_version(a) for a in ids.values()}
        committed = {ids[p]: x.watermark for p, x in pos.items()}
        bases = {p: x.base for p, x in pos.items()}
        starts = {p: x.kafka_start for p, x in pos.items()}
        nexts = {p: s or 0 for p, s in starts.items()}
        # A pipeline: a batch decodes in slices on the worker processes while this thread fetches
        # the next, and one commit is in flight on a writer thread (delta-rs releases the GIL).
        # Batches are committed in offset order, each after the one before it: exactly-once as before.
        decoding: deque[tuple[list[Future[tuple[pa.Table, list[dict[str, Any]]]]], dict[int, KafkaRecord], int]] = (
            deque()
        )
        pending: tuple[Future[int], dict[str, int], int, int, int] | None = None

        def finish() -> None:
            assert pending is not None
            future, txns, records, rows, quarantined = pending
            version = future.result()
            result.records += records
            result.rows += rows
            result.quarantined += quarantined
            result.commits += 1
            committed.update(txns)
            for p in parts:
                if (off := txns.get(ids[p])) is not None:
                    nexts[p] = off + 1 - bases[p]
            if on_commit is not None:
                on_commit(version)

        def commit_oldest() -> None:
            nonlocal pending
            chunks, last, records = decoding.popleft()
            parts_done = [c.result() for c in chunks]
            data = parts_done[0][0] if len(parts_done) == 1 else pa.concat_tables([t for t, _ in parts_done])
            bad = [q for _, qs in parts_done for q in qs]
            txns = {ids[p]: r.offset for p, r in last.items()}
            marks = {fingerprint_id(topic, p): record_fingerprint(r) for p, r in last.items()}
            bad = [
                q
                for q in bad
                if (w := quarantined_upto.get(ids[q["kafka_partition"]])) is None or q["kafka_offset"] > w
            ]
            quarantine: tuple[dict[str, int], dict[str, int | None]] | None = None
            if bad:
                # never below what `quarantine` holds (ahead of the table after a crash between the two)
                q_txns = {a: v if (w := quarantined_upto[a]) is None else max(v, w) for a, v in txns.items()}
                quarantine = (q_txns, {a: quarantined_upto[a] for a in txns})
                quarantined_upto.update(q_txns)
            if pending is not None:
                finish()
            expect = {a: committed[a] for a in txns}
            future = writer.submit(_commit, lake, kind, data, bad, txns, marks, expect, data_dt, q_dt, quarantine)
            pending = (future, txns, records, data.num_rows, len(bad))

        with ThreadPoolExecutor(1, thread_name_prefix="agentlake-commit") as writer:
            for n, batch in enumerate(_batches(consumer, topic, starts, batch_records, idle_ms, bases)):
                last: dict[int, KafkaRecord] = {}
                for r in batch:  # a partition's records come in offset order: its last is its highest
                    last[r.partition] = r
                if decoders is not None:
                    # each worker decodes a slice of the batch; the slices are committed together
                    size = -(-len(batch) // n_workers)
                    chunks = [
                        decoders.submit(_decode_in_worker, kind, batch[i : i + size])
                        for i in range(0, len(batch), size)
                    ]
                else:
                    done_now: Future[tuple[pa.Table, list[dict[str, Any]]]] = Future()
                    done_now.set_result(_decode(kind, batch, redactor))
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


def _accept(
    lake: Lake, kind: Kind, topic: str, data_dt: Any, pos: dict[int, Position], problems: dict[int, str], epoch: int
) -> dict[str, Any]:
    """Commit a new epoch: each reset partition continues at one past every lake offset it holds."""
    q = lake.table("quarantine")
    reset: dict[str, Any] = {}
    marks = {epoch_id(topic): epoch + 1}
    for p in sorted(problems):
        x = pos[p]
        held = [
            w for w in (x.watermark, None if q is None else q.transaction_version(app_id(topic, p))) if w is not None
        ]
        base = max(held) + 1
        marks[base_id(topic, p)] = base
        reset[str(p)] = {"watermark": x.watermark, "base": base, "broker": problems[p]}
    record = {"topic": topic, "epoch": epoch + 1, "partitions": reset}
    version = lake.write(
        kind,
        TABLES[kind].empty_table(),
        marks=marks,
        expect={app_id(topic, p): pos[p].watermark for p in problems},
        snapshot=data_dt,
        metadata={"agentlake.operation": "accept-reset", "agentlake.reset": json.dumps(record, sort_keys=True)},
    )
    return {**record, "version": version}


def accept_reset(
    lake: Lake, kafka: KafkaSettings, kind: Kind, *, consumer: Any | None = None, timeout_s: float = 10.0
) -> dict[str, Any] | None:
    """Accept the new log of ``kind``'s topic after a reset: what was recorded, or None when the log was not reset.

    Checks the log as ingestion does (so a log that still holds the lake's records is never
    re-read) and commits, into the table, a new epoch and a base per reset partition, with the
    details in the commit's metadata (``agentlake.reset``). The next ingestion reads those
    partitions from their first record, stored at offset + base.
    """
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    dt = lake.table(kind)
    if dt is None:
        return None
    own = consumer is None
    consumer = consumer or make_fetcher(kafka)
    try:
        parts = _partitions(consumer, topic)
        epoch, pos = positions(dt, topic, parts)
        problems = check_log(consumer, topic, pos, legacy=_legacy_match(lake, kind, dt), timeout_s=timeout_s)
        if not problems:
            return None
        return _accept(lake, kind, topic, dt, pos, problems, epoch)
    finally:
        if own:
            consumer.close()


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


_REDACTORS: dict[str, Redactor] = {}
_WORKER_REDACTOR: Redactor | None = None  # a decoder process's: its pool's run's


def _redactor(redaction: RedactionSettings | None) -> Redactor:
    """The redactor of ``redaction`` (None: this process's settings), one per distinct settings."""
    if redaction is None:
        from schemas.config import load_settings

        redaction = load_settings().redaction
    key = redaction.model_dump_json()
    if key not in _REDACTORS:
        if len(_REDACTORS) > 16:  # settings that change run after run: stay bounded
            _REDACTORS.clear()
        _REDACTORS[key] = Redactor(redaction)
    return _REDACTORS[key]


def _decoder_init(redactor: Redactor | None = None) -> None:
    """A decoder dies with its parent, even one killed with SIGKILL (Linux), instead of lingering;
    it redacts with the run's ``redactor`` (handed over by the fork, never pickled per batch)."""
    global _WORKER_REDACTOR
    _WORKER_REDACTOR = redactor
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _decoder_pool(workers: int, redactor: Redactor | None = None) -> ProcessPoolExecutor:
    """Decoder processes, forked now (fork: nothing to re-import, so a run pays milliseconds)."""
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("fork"), initializer=_decoder_init, initargs=(redactor,)
    )
    pool.submit(int).result()  # with fork, the first submit starts every worker
    return pool


def _commit(
    lake: Lake,
    kind: Kind,
    data: pa.Table,
    bad: list[dict[str, Any]],
    txns: dict[str, int],
    marks: dict[str, int],
    expect: dict[str, int | None],
    data_dt: Any,
    q_dt: list[Any],
    quarantine: tuple[dict[str, int], dict[str, int | None]] | None,
) -> int:
    """Quarantine first, then the rows, each commit carrying the batch's offsets; the new version.

    Each commit builds on the run's own snapshot of its table and expects the positions this run
    left there: another run's commit of the same partitions makes it fail before anything lands.
    """
    if bad:
        assert quarantine is not None
        if q_dt[0] is None:
            q_dt[0] = lake.pin("quarantine")
        q_txns, q_expect = quarantine
        table = pa.Table.from_pylist(bad, schema=QUARANTINE)
        lake.write("quarantine", table, txns=q_txns, snapshot=q_dt[0], expect=q_expect)
    return lake.write(kind, data, txns=txns, marks=marks, snapshot=data_dt, expect=expect)


def _decode_in_worker(kind: Kind, batch: list[KafkaRecord]) -> tuple[pa.Table, list[dict[str, Any]]]:
    """``_decode`` in a decoder process, with the redactor its pool was forked with."""
    if kind == "spans" and _WORKER_REDACTOR is None:
        raise RuntimeError("a decoder process without a redactor: spans would be stored unredacted")
    return _decode(kind, batch, _WORKER_REDACTOR)


def _decode(
    kind: Kind, batch: list[KafkaRecord], redactor: Redactor | None = None
) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Rows and quarantine rows of ``batch``; spans redacted by ``redactor`` (None: not redacted,
    their ``redacted`` column null; only for comparing ids, never for rows that are stored)."""
    if kind == "spans":
        table, quarantined = decode_spans(batch)
        return (table if redactor is None else redact_spans(table, redactor)), quarantined
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
    # read and committed on one snapshot: a concurrent copy of the same range makes this one fail
    target = lake.pin("rewards")
    cond, txns = unseen_offsets(
        spans,
        spans_topic,
        watermark=lambda p: app_id(spans_topic, p),
        seen=lambda p: target.transaction_version(span_rewards_app_id(spans_topic, p)),
        seen_app=lambda p: span_rewards_app_id(spans_topic, p),
    )
    if cond is None:
        return 0
    rows = pl.scan_delta(spans).filter(pl.col("reward_value").is_not_null()).filter(cond).collect().to_arrow()
    data = reward_rows_from_spans(rows)
    expect = {a: target.transaction_version(a) for a in txns}
    lake.write("rewards", data, txns=txns, snapshot=target, expect=expect)
    return data.num_rows
