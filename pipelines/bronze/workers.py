"""N ingestion workers on one topic and one table: worker i of N owns the partitions p with p % N == i.

Why processes: decoding and Arrow building are Python, so one process tops out at about one core;
N processes on disjoint partition sets commit side by side to the same Delta table, each batch's
rows and its partitions' offsets in one commit (``ingest(partitions=...)``). Exactly-once holds per
partition exactly as with one run: a worker's commit is refused when another run committed one of
its partitions first, and retried when it was refused for anything else.

Workers are not forked from the caller: it (a Dagster run, the CLI, a test) may already run delta-rs's
runtime and librdkafka's threads, which a forked child inherits half-initialized (delta-rs refuses to
run in such a child). They fork from a forkserver that imported ingestion and started no thread:
one fresh interpreter per calling process, not one per worker and run.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from pipelines.bronze.decoders import default_workers
from pipelines.bronze.fetch import make_fetcher, topic_partitions
from pipelines.bronze.ingest import IngestResult, ingest
from pipelines.bronze.log_reset import OnReset
from pipelines.bronze.positions import Kind
from schemas.config import KafkaSettings, RedactionSettings
from schemas.errors import ConfigError
from schemas.lake import Lake


def worker_partitions(parts: list[int], worker: int, workers: int) -> list[int]:
    """The partitions of ``parts`` worker ``worker`` of ``workers`` owns: p % workers == worker."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}: a worker index is 0 to {workers - 1}")
    return [p for p in parts if p % workers == worker]


def partition_sets(topic: str, parts: list[int], workers: int) -> list[list[int]]:
    """Each worker's partitions; a ``ConfigError`` when a worker would own none."""
    if workers > len(parts):
        raise ConfigError(
            f"ingest.workers = {workers}, but topic {topic!r} has {len(parts)} partitions: a worker would own "
            f"none; set ingest.workers to at most {len(parts)}, or give the topic more partitions"
        )
    return [worker_partitions(parts, i, workers) for i in range(workers)]


def decoders_per_worker(kind: Kind, workers: int, decoders: int = -1) -> int:
    """Decoder processes each worker forks: ``decoders``, or (-1) the machine's default split among workers."""
    return decoders if decoders >= 0 else default_workers(kind) // workers


def merge(topic: str, results: list[IngestResult], seconds: float) -> IngestResult:
    """One result for the workers' runs: sums, every partition's next offset, ``seconds`` of wall time."""
    out = IngestResult(topic=topic, seconds=seconds)
    for r in results:
        out.records += r.records
        out.rows += r.rows
        out.quarantined += r.quarantined
        out.commits += r.commits
        out.lag += r.lag
        out.epoch = max(out.epoch, r.epoch)
        out.next_offsets.update(r.next_offsets)
        out.worker_seconds.append(r.seconds)
        out.cpu_seconds += r.cpu_seconds
    return out


def ingest_workers(
    lake: Lake,
    kafka: KafkaSettings,
    kind: Kind,
    *,
    workers: int,
    batch_records: int = 2000,
    decoders: int = -1,
    on_reset: OnReset = "stop",
    redaction: RedactionSettings | None = None,
    max_batches: int | None = None,
) -> IngestResult:
    """``ingest`` by ``workers`` processes at once, each owning its share of the topic's partitions.

    One worker is ``ingest`` in this process. With more, every worker runs to its end even when
    another fails; then the first failure is raised (a ``ConcurrentWriteError`` when another run
    had taken some of the partitions: what the other workers committed stays, exactly once).
    """
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    per_worker = decoders_per_worker(kind, workers, decoders)
    options: dict[str, Any] = {
        "batch_records": batch_records,
        "workers": per_worker,
        "on_reset": on_reset,
        "redaction": redaction,
        "max_batches": max_batches,
    }
    if workers == 1:
        return ingest(lake, kafka, kind, **options)
    probe = make_fetcher(kafka)
    try:
        parts = topic_partitions(probe, topic)
    finally:
        probe.close()
    sets = partition_sets(topic, parts, workers)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=worker_context()) as pool:
        futures: list[Future[IngestResult]] = [
            pool.submit(_run_worker, lake, kafka, kind, owned, options) for owned in sets
        ]
        results: list[IngestResult] = []
        errors: list[BaseException] = []
        for f in futures:
            try:
                results.append(f.result())
            except Exception as exc:  # every worker finishes first; the first failure is raised below
                errors.append(exc)
    if errors:
        raise errors[0]
    return merge(topic, results, time.perf_counter() - t0)


def worker_context() -> mp.context.BaseContext:
    """Where worker processes come from: the forkserver, with ingestion imported before its first fork."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pipelines.bronze.workers"])  # no effect once the server runs
    return ctx


def _run_worker(
    lake: Lake, kafka: KafkaSettings, kind: Kind, owned: list[int], options: dict[str, Any]
) -> IngestResult:
    """One worker's run, in its own process (fresh from the forkserver: its CPU time is the run's)."""
    res = ingest(lake, kafka, kind, partitions=owned, **options)
    res.cpu_seconds = cpu_seconds()
    return res


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (a worker's decoders, joined by ``ingest``)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
