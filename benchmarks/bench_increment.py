"""The silver and gold steps of one increment on a built lake, without Kafka: wall and CPU seconds.

On a shared machine wall time swings with the load; the process's CPU seconds (its Rust threads
included) show what the steps themselves cost. The increment (10,000 rollouts of bench_pipelines'
shape, decoded as ingestion does) is written to `spans` with its offsets; the lake under it is built
by `benchmarks/lake_builder.py` from a template lake that the real steps built from the same spans.
Lakes are kept under ``--work`` between runs (a 1M-rollout lake is about 1.6 GB).

    .venv/bin/python benchmarks/bench_increment.py 0 1000000
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polars as pl  # noqa: E402

from benchmarks.lake_builder import build_lake, ensure_template  # noqa: E402
from pipelines.bronze.decoders import decode_batch  # noqa: E402
from pipelines.bronze.decoding import KafkaRecord  # noqa: E402
from pipelines.bronze.positions import app_id  # noqa: E402
from pipelines.gold.transitions_step import update_transitions  # noqa: E402
from pipelines.silver.trajectories_step import update_trajectories  # noqa: E402
from schemas.config import CreditSettings, KafkaSettings  # noqa: E402
from schemas.lake import Lake  # noqa: E402

KAFKA = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="new", rewards_topic="new.rewards")
PARTITIONS = 4


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def increment_spans(path: str, rollouts: int) -> pl.DataFrame:
    """The increment's `spans` rows (cached at ``path``): bench_pipelines' generator, decoded as ingestion does."""
    from tests.pipelines.otel import Call, Rollout, make_spans, span_record

    if not os.path.exists(path):
        rng, recs = random.Random(0), []
        for i in range(rollouts):
            calls, prompt = [], [rng.randrange(49152) for _ in range(64)]
            for _ in range(3):
                resp = [rng.randrange(49152) for _ in range(16)]
                calls.append(Call(prompt=list(prompt), response=resp, logprobs=[-0.5] * 16))
                prompt = prompt + resp + [rng.randrange(49152) for _ in range(8)]
            r = Rollout(f"roll-{i}", task_id=f"task-{i // 8}", calls=calls, final_reward=float(rng.random() < 0.5))
            rec = span_record(make_spans(r))
            recs.append(KafkaRecord("new", i % PARTITIONS, i // PARTITIONS, rec["key"], rec["value"], rec["headers"]))
        table, _ = decode_batch("spans", recs)
        pl.from_arrow(table).write_parquet(path)  # type: ignore[union-attr]
    return pl.read_parquet(path)


def _base(n: int, same_day: bool) -> str:
    return f"{'oneday' if same_day else 'base'}{n}"


def one(n: int, rollouts: int, root: str, same_day: bool = False) -> None:
    """The increment on a copy of the built lake of ``n`` rollouts; one row of the table."""
    spans = increment_spans(os.path.join(root, f"inc{rollouts}.parquet"), rollouts).to_arrow()
    txns = {app_id("new", p): (rollouts - 1) // PARTITIONS for p in range(PARTITIONS)}
    work = Lake(os.path.join(root, "run"))
    shutil.rmtree(work.root, ignore_errors=True)
    if n:
        # hard links: Delta never changes a file it wrote (new commits and rewrites are new files; the
        # `_last_checkpoint` pointer is replaced, not written in place), so the built lake stays as it was and
        # a 10M-rollout lake (~17 GB) is ready in seconds rather than copied
        shutil.copytree(os.path.join(root, _base(n, same_day)), work.root, copy_function=os.link)
    work.write("spans", spans, txns=txns)
    c0, t0 = _cpu(), time.perf_counter()
    update_trajectories(work, KAFKA, idle_timeout_s=300)
    c1, t1 = _cpu(), time.perf_counter()
    update_transitions(work, CreditSettings())
    c2, t2 = _cpu(), time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{n:>14,}{t1 - t0:>9.2f}{t2 - t1:>9.2f}{c1 - c0:>12.2f}{c2 - c1:>13.2f}{rss:>13.0f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, help="lake sizes in rollouts (0: an empty lake)")
    ap.add_argument("--rollouts", type=int, default=10_000, help="the increment")
    ap.add_argument("--work", default="/tmp/agentlake-bench-increment")
    ap.add_argument(
        "--same-day",
        action="store_true",
        help="the lake's rollouts all on the increment's own day (one busy day's partition), not on the days before",
    )
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.one is not None:
        return one(args.one, args.rollouts, args.work, args.same_day)
    template = ensure_template(args.work, args.rollouts)
    print(f"{'lake rollouts':>14}{'traj s':>9}{'trans s':>9}{'traj cpu s':>12}{'trans cpu s':>13}{'peak RSS MB':>13}")
    for n in args.sizes:
        base = os.path.join(args.work, _base(n, args.same_day))
        if n and not os.path.exists(base):
            build_lake(template, Lake(base), n, same_day=args.same_day)
        # each size in its own process (not a fork: polars' and delta-rs' thread pools do not survive one),
        # so its peak RSS is its own
        subprocess.run(
            [sys.executable, __file__, "--one", str(n), "--rollouts", str(args.rollouts), "--work", args.work]
            + (["--same-day"] if args.same_day else []),
            check=True,
        )


if __name__ == "__main__":
    main()
