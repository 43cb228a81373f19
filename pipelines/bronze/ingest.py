"""Kafka to bronze Delta tables, exactly once, in bounded batches: the ingestion loop.

Positions come from the lake (`pipelines.bronze.positions`); records from confluent-kafka
(`pipelines.bronze.fetch`), from each watermark's record, which shows the log was not reset
(`pipelines.bronze.log_reset`) before the first batch; decoding on forked processes
(`pipelines.bronze.decoders`). One commit is in flight on a writer thread while the next batch is decoded.

Undecodable records go to `quarantine` first, with their own app transactions, so a crash
between the two commits neither loses nor repeats a quarantined record.

Exactly once, also with two runs at once: a run reads the positions from one Delta snapshot and
commits every batch on top of it (``Lake.write(snapshot=..., expect=...)``), so a run whose
partitions another run committed first fails before its rows land (``ConcurrentWriteError``).

Scaling out: a run may own a set of the topic's partitions (``partitions=``; N workers of
`pipelines.bronze.workers`). Runs of disjoint sets commit to one table side by side: delta-rs
rebases an append whose app transactions no other commit touched, and a commit that still fails
for a reason other than this run's own partitions (a schema or property change by someone else)
is retried on the newest snapshot once that snapshot is checked to hold this run's positions.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipelines.bronze.decoders import decode_batch, decode_in_worker, decoder_pool, default_workers, redactor_for
from pipelines.bronze.decoding import KafkaRecord
from pipelines.bronze.fetch import LogNotVerified, batches, make_fetcher, records_behind, topic_partitions
from pipelines.bronze.log_reset import ACCEPT_RESET_HINT, OnReset, accept_new_log, check_log, legacy_match
from pipelines.bronze.positions import Kind, Position, app_id, fingerprint_id, positions, record_fingerprint
from schemas.config import KafkaSettings, RedactionSettings
from schemas.errors import ConcurrentWriteError, LogResetError
from schemas.lake import Lake
from schemas.tables import QUARANTINE


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
    worker_seconds: list[float] = field(default_factory=list)  # each worker's own run (pipelines.bronze.workers)
    cpu_seconds: float = 0.0  # the worker processes' CPU time, decoders included (set by pipelines.bronze.workers)

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
    partitions: Collection[int] | None = None,
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
    ``partitions``: the topic's partitions this run owns (default: all); runs of disjoint sets may
    run at once (`pipelines.bronze.workers`), a partition of the topic that does not exist is an error.
    """
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    result = IngestResult(topic=topic)
    t0 = time.perf_counter()
    n_workers = default_workers(kind) if workers is None else workers
    redactor = redactor_for(redaction) if kind == "spans" else None
    # Forked before the consumer and writer threads exist, so no child starts with a lock held.
    decoders = decoder_pool(n_workers, redactor) if n_workers > 0 else None
    own = consumer is None
    consumer = consumer or make_fetcher(kafka)
    try:
        parts = owned(topic, topic_partitions(consumer, topic), partitions)
        ids = {p: app_id(topic, p) for p in parts}
        # One snapshot for the whole run: the positions are read from it and every batch commits on
        # top of it (and then on top of this run's previous commit), never on a newer one.
        data_dt = lake.pin(kind)
        snap = [data_dt]  # the snapshot commits build on: replaced by a newer one when a commit is retried
        epoch, pos, stream = read_log(lake, kind, consumer, topic, data_dt, parts, on_reset, batch_records, idle_ms)
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
            future = writer.submit(_commit, lake, kind, data, bad, txns, marks, expect, snap, q_dt, quarantine)
            pending = (future, txns, records, data.num_rows, len(bad))

        with ThreadPoolExecutor(1, thread_name_prefix="agentlake-commit") as writer:
            for n, batch in enumerate(stream):
                last: dict[int, KafkaRecord] = {}
                for r in batch:  # a partition's records come in offset order: its last is its highest
                    last[r.partition] = r
                if decoders is not None:
                    # each worker decodes a slice of the batch; the slices are committed together
                    size = -(-len(batch) // n_workers)
                    chunks = [
                        decoders.submit(decode_in_worker, kind, batch[i : i + size]) for i in range(0, len(batch), size)
                    ]
                else:
                    done_now: Future[tuple[pa.Table, list[dict[str, Any]]]] = Future()
                    done_now.set_result(decode_batch(kind, batch, redactor))
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
        result.lag = records_behind(consumer, topic, parts, nexts)
    finally:
        if decoders is not None:
            decoders.shutdown(wait=True, cancel_futures=True)
        if own:
            consumer.close()
    result.seconds = time.perf_counter() - t0
    return result


def read_log(
    lake: Lake,
    kind: Kind,
    consumer: Any,
    topic: str,
    data_dt: Any,
    parts: list[int],
    on_reset: OnReset,
    batch_records: int,
    idle_ms: int,
) -> tuple[int, dict[int, Position], Iterator[list[KafkaRecord]]]:
    """The epoch, the positions to continue from and the batches after them, once the log holds what the lake read.

    Usually the batches check it themselves: they start at each watermark's record and compare its
    fingerprint (``batches(verify=...)``), so the increment is fetched once. When that check fails
    before any batch (or a watermark is from before fingerprints), ``check_log`` reads the log to say
    why: a reset stops the run (``LogResetError``) or, with ``on_reset="accept"``, starts a new epoch;
    otherwise the log was fine after all (a slow broker) and the batches are read afresh.
    """
    epoch, pos = positions(data_dt, topic, parts)
    held = [x for x in pos.values() if x.kafka_last is not None]
    verify = {
        x.partition: (x.watermark, x.fingerprint) for x in held if x.watermark is not None and x.fingerprint is not None
    }
    if len(verify) == len(held):
        stream = _batches_from(consumer, topic, pos, batch_records, idle_ms, verify)
        try:
            first = next(stream, None)
        except LogNotVerified:
            pass
        else:
            return epoch, pos, itertools.chain([] if first is None else [first], stream)
    problems = check_log(consumer, topic, pos, legacy=legacy_match(lake, kind, data_dt))
    if problems:
        if on_reset != "accept":
            raise LogResetError(topic, [problems[p] for p in sorted(problems)], ACCEPT_RESET_HINT)
        accept_new_log(lake, kind, topic, data_dt, pos, problems, epoch)
        epoch, pos = positions(data_dt, topic, parts)
    return epoch, pos, _batches_from(consumer, topic, pos, batch_records, idle_ms, None)


def _batches_from(
    consumer: Any,
    topic: str,
    pos: dict[int, Position],
    batch_records: int,
    idle_ms: int,
    verify: dict[int, tuple[int, int]] | None,
) -> Iterator[list[KafkaRecord]]:
    starts = {p: x.kafka_start for p, x in pos.items()}
    bases = {p: x.base for p, x in pos.items()}
    return batches(consumer, topic, starts, batch_records, idle_ms, bases, verify=verify)


def owned(topic: str, parts: list[int], partitions: Collection[int] | None) -> list[int]:
    """The topic's partitions a run owns: ``partitions`` (all when None), each one the topic has."""
    if partitions is None:
        return parts
    missing = sorted(set(partitions) - set(parts))
    if missing or not partitions:
        raise ValueError(f"topic {topic!r} has partitions {parts}; a run cannot own {missing or 'none of them'}")
    return sorted(set(partitions))


COMMIT_ATTEMPTS = 8  # a commit refused for someone else's change is retried this often (disjoint workers)


def _commit(
    lake: Lake,
    kind: Kind,
    data: pa.Table,
    bad: list[dict[str, Any]],
    txns: dict[str, int],
    marks: dict[str, int],
    expect: dict[str, int | None],
    snap: list[Any],
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
        write_retrying(lake, "quarantine", table, txns=q_txns, marks={}, snap=q_dt, expect=q_expect)
    return write_retrying(lake, kind, data, txns=txns, marks=marks, snap=snap, expect=expect)


def write_retrying(
    lake: Lake,
    name: str,
    data: pa.Table,
    *,
    txns: dict[str, int],
    marks: dict[str, int],
    snap: list[Any],
    expect: dict[str, int | None],
    attempts: int = COMMIT_ATTEMPTS,
) -> int:
    """``Lake.write`` on ``snap[0]``, retried on a newer snapshot when the conflict was not over ``expect``.

    A refused commit landed nothing. When the newest snapshot still holds exactly the positions
    ``expect`` names, no other writer consumed these partitions: what refused the commit was another
    writer's change elsewhere (its own partitions beyond delta-rs's retries, a schema merge, a
    property), so the same rows are committed again on that snapshot, which becomes ``snap[0]``.
    Otherwise (another run took these partitions) the ``ConcurrentWriteError`` stands.
    """
    for attempt in range(attempts):
        try:
            return lake.write(name, data, txns=txns, marks=marks, snapshot=snap[0], expect=expect)
        except ConcurrentWriteError:
            fresh = lake.table(name)
            if (
                attempt + 1 == attempts
                or fresh is None
                or any(fresh.transaction_version(a) != v for a, v in expect.items())
            ):
                raise
            snap[0] = fresh
            time.sleep(0.01 * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover
