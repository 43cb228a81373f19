"""Ingestion scaled out: 1 vs N ingest worker processes on the same backlog (issue 28), spans/s and the ratio.

The rollouts are produced once to a topic of ``--partitions`` partitions; each of ``--runs`` rounds
ingests them into a fresh lake once per configuration (interleaved, so a burst of other load on this
shared machine hits every configuration alike), and the table shows medians. A configuration is N
workers (`pipelines.bronze.workers.ingest_workers`, worker processes spawned per run as the Dagster
asset does) and the decoder processes each worker forks. Two rates per configuration:

* end to end: spans over the call's wall time, worker start-up (a fresh interpreter each) included;
* steady: spans over the slowest worker's own run, what long-running workers would sustain;

and the CPU seconds all of a configuration's processes spent per 100k spans (decoders included): with
cores to spare, N workers scale while that stays flat. The last column is the physical limit: the
configuration's CPU seconds spread over all of the machine's cores (a process's Rust threads use more
than one), the shortest wall time that CPU could take, over the slowest worker's measured time (1.00:
every core busy all along; the broker's own CPU is not counted, so 1.00 is out of reach here).

    nice -n 10 .venv/bin/python benchmarks/bench_ingest_workers.py --rollouts 20000 --runs 3
"""

from __future__ import annotations

import argparse
import functools
import itertools
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_pipelines import bench_topics, produce_rollouts  # noqa: E402
from pipelines.bronze.workers import cpu_seconds, decoders_per_worker, ingest_workers  # noqa: E402
from schemas.config import KafkaSettings  # noqa: E402
from schemas.lake import Lake  # noqa: E402


def one(kafka: KafkaSettings, root: str, workers: int, decoders: int) -> dict[str, Any]:
    """One ingestion of the whole backlog into a fresh lake by ``workers`` workers."""
    lake = Lake(tempfile.mkdtemp(prefix=f"w{workers}d{decoders}-", dir=root))
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    res = ingest_workers(lake, kafka, "spans", workers=workers, decoders=decoders)
    wall = time.perf_counter() - t0
    busiest = max(res.worker_seconds) if res.worker_seconds else res.seconds
    # one worker runs in this process (its decoders are this process's children); N in worker processes
    cpu = res.cpu_seconds if res.worker_seconds else cpu_seconds() - cpu0
    shutil.rmtree(lake.root, ignore_errors=True)
    return {"rows": res.rows, "wall_s": wall, "busiest_s": busiest, "commits": res.commits, "cpu_s": cpu}


def produce_backlog(kafka: KafkaSettings, rollouts: int, calls: int, producers: int) -> int:
    """The backlog, produced by ``producers`` processes on disjoint rollout ranges (setup, not measured:
    the OTel SDK that makes the spans runs at a few thousand spans/s per core)."""
    if producers <= 1:
        return produce_rollouts(kafka, rollouts, calls, 64, 16)
    bounds = [rollouts * i // producers for i in range(producers + 1)]
    with multiprocessing.get_context("spawn").Pool(producers) as pool:
        counts = pool.starmap(
            functools.partial(_produce_range, kafka, calls),
            [(hi - lo, lo) for lo, hi in itertools.pairwise(bounds)],
        )
    return sum(counts)


def _produce_range(kafka: KafkaSettings, calls: int, n: int, first: int) -> int:
    return produce_rollouts(kafka, n, calls, 64, 16, first=first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=20_000)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--producers", type=int, default=1, help="processes producing the backlog (setup only)")
    ap.add_argument("--workers", default="1,2", help="worker counts to compare; the first is the baseline")
    ap.add_argument(
        "--decoders", default="-1,0", help="decoder processes per worker (-1: the default split among workers)"
    )
    args = ap.parse_args()

    kafka, broker = bench_topics("bench.workers", args.partitions)
    root = tempfile.mkdtemp(prefix="agentlake-bench-workers-")
    counts = [int(x) for x in args.workers.split(",")]
    configs = [(n, int(d)) for d in args.decoders.split(",") for n in counts]
    got: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in configs}
    try:
        t0 = time.perf_counter()
        n_spans = produce_backlog(kafka, args.rollouts, args.calls, args.producers)
        print(f"produced {args.rollouts} rollouts, {n_spans} spans in {time.perf_counter() - t0:.1f}s", flush=True)
        for i in range(args.runs):
            for n, d in configs:
                r = one(kafka, root, n, d)
                assert r["rows"] == n_spans, f"{r['rows']} rows of {n_spans} spans"
                got[(n, d)].append(r)
                print(
                    f"run {i + 1}, {n} worker(s), decoders {d}: {r['wall_s']:.2f}s wall, "
                    f"{r['busiest_s']:.2f}s slowest worker, {r['cpu_s']:.1f} CPU s, {r['commits']} commits",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if broker is not None:
            broker.stop()

    print(
        f"\n{args.rollouts:,} rollouts ({n_spans:,} spans) on {args.partitions} partitions, "
        f"{os.cpu_count()} CPUs, medians of {args.runs} runs"
    )
    print(
        "| workers | decoders each | end to end spans/s | vs 1 worker | steady spans/s | vs 1 worker "
        "| CPU s per 100k spans | CPU-bound floor s | floor / measured |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, d in configs:
        wall = statistics.median(r["wall_s"] for r in got[(n, d)])
        busy = statistics.median(r["busiest_s"] for r in got[(n, d)])
        base = got[(counts[0], d)]
        base_wall = statistics.median(r["wall_s"] for r in base)
        base_busy = statistics.median(r["busiest_s"] for r in base)
        cpu_s = statistics.median(r["cpu_s"] for r in got[(n, d)])
        each = decoders_per_worker("spans", n, d)
        floor = cpu_s / (os.cpu_count() or 1)
        print(
            f"| {n} | {each} | {n_spans / wall:,.0f} | {base_wall / wall:.2f}x | "
            f"{n_spans / busy:,.0f} | {base_busy / busy:.2f}x | {cpu_s * 100_000 / n_spans:.1f} | "
            f"{floor:.2f} | {floor / busy:.2f} |"
        )


if __name__ == "__main__":
    main()
