"""Pipelines benchmark: Kafka -> `spans` (spans/s) and `spans` -> `transitions` (rollouts/s).

Each phase runs in a forked child so its peak RSS is its own. Next to each rate it prints a
ceiling measured in the same run: the same rows written straight to Parquet with pyarrow.

    .venv/bin/python benchmarks/bench_pipelines.py --rollouts 10000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polars as pl  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pipelines.ingest import ingest  # noqa: E402
from pipelines.lake import Lake  # noqa: E402
from pipelines.steps import update_trajectories, update_transitions  # noqa: E402
from schemas.config import CreditSettings, KafkaSettings  # noqa: E402


def _child(fn: Callable[[], dict[str, Any]], q: Any) -> None:
    out = fn()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    q.put(out)


def in_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in a forked process; return its result plus its own peak RSS."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, q))
    p.start()
    out = q.get()
    p.join()
    return out


def produce_rollouts(kafka: KafkaSettings, n: int, calls: int, prompt_len: int, response_len: int) -> int:
    """Spans through the real OTel SDK, encoded as the collector does, produced with kafka-python."""
    from kafka import KafkaProducer

    from tests.pipelines.otel import Call, Rollout, make_spans, span_record

    rng = random.Random(0)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=20, batch_size=1 << 20)
    n_spans = 0
    for i in range(n):
        cs = []
        prompt = [rng.randrange(49152) for _ in range(prompt_len)]
        for _ in range(calls):
            resp = [rng.randrange(49152) for _ in range(response_len)]
            cs.append(Call(prompt=list(prompt), response=resp, logprobs=[-0.5] * response_len))
            prompt = prompt + resp + [rng.randrange(49152) for _ in range(8)]
        r = Rollout(f"roll-{i}", task_id=f"task-{i // 8}", calls=cs, final_reward=float(rng.random() < 0.5))
        spans = make_spans(r)
        n_spans += len(spans)
        rec = span_record(spans, key=r.rollout_id)
        producer.send(kafka.spans_topic, key=rec["key"], value=rec["value"], headers=rec["headers"])
    producer.flush(120)
    producer.close()
    return n_spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=16)
    ap.add_argument("--batch-records", type=int, default=2000)
    args = ap.parse_args()

    from agentlake.stack.broker import LocalBroker, ensure_topics

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if not bootstrap:
        broker = LocalBroker().start()
        bootstrap = broker.bootstrap
    suffix = str(int(time.time()))
    kafka = KafkaSettings(
        bootstrap_servers=bootstrap, spans_topic=f"bench.spans.{suffix}", rewards_topic=f"bench.rewards.{suffix}"
    )
    ensure_topics(kafka, bootstrap, [kafka.spans_topic, kafka.rewards_topic])
    root = tempfile.mkdtemp(prefix="agentlake-bench-")
    lake = Lake(os.path.join(root, "lake"))
    try:
        t0 = time.perf_counter()
        n_spans = produce_rollouts(kafka, args.rollouts, args.calls, args.prompt_len, args.response_len)
        print(f"produced {args.rollouts} rollouts, {n_spans} spans in {time.perf_counter() - t0:.1f}s", flush=True)

        def do_ingest() -> dict[str, Any]:
            r = ingest(lake, kafka, "spans", batch_records=args.batch_records)
            return {"rows": r.rows, "seconds": r.seconds, "commits": r.commits}

        ing = in_child(do_ingest)

        def spans_ceiling() -> dict[str, Any]:
            # the same rows, read back once (untimed), written straight to Parquet with pyarrow
            t = pl.read_delta(lake.uri("spans")).to_arrow()
            t0 = time.perf_counter()
            pq.write_table(t, os.path.join(root, "spans.parquet"))
            return {"rows": t.num_rows, "seconds": time.perf_counter() - t0}

        ing_ceil = in_child(spans_ceiling)

        def do_transitions() -> dict[str, Any]:
            t0 = time.perf_counter()
            tr = update_trajectories(lake, kafka, idle_timeout_s=300)
            t1 = time.perf_counter()
            tn = update_transitions(lake, CreditSettings())
            t2 = time.perf_counter()
            return {
                "rollouts": tr.rollouts,
                "rows": tn.rows,
                "seconds": t2 - t0,
                "traj_s": t1 - t0,
                "trans_s": t2 - t1,
            }

        gold = in_child(do_transitions)

        def transitions_ceiling() -> dict[str, Any]:
            t = pl.read_delta(lake.uri("transitions")).to_arrow()
            t0 = time.perf_counter()
            pq.write_table(t, os.path.join(root, "transitions.parquet"))
            return {"rows": t.num_rows, "seconds": time.perf_counter() - t0}

        gold_ceil = in_child(transitions_ceiling)
    finally:
        if broker is not None:
            broker.stop()

    spans_s = ing["rows"] / ing["seconds"]
    ceil_s = ing_ceil["rows"] / ing_ceil["seconds"]
    roll_s = gold["rollouts"] / gold["seconds"]
    # the ceiling for the gold step: the rollouts' transitions rows written straight to Parquet
    roll_ceil = gold["rollouts"] / gold_ceil["seconds"]
    print()
    print(f"{'measure':<34}{'pipeline':>14}{'pyarrow->parquet':>18}{'ratio':>8}{'peak RSS MB':>13}")
    print(
        f"{'spans/s, Kafka -> spans':<34}{spans_s:>14,.0f}{ceil_s:>18,.0f}{spans_s / ceil_s:>8.2f}"
        f"{ing['peak_rss_mb']:>13.0f}"
    )
    print(
        f"{'rollouts/s, spans -> transitions':<34}{roll_s:>14,.0f}{roll_ceil:>18,.0f}{roll_s / roll_ceil:>8.2f}"
        f"{gold['peak_rss_mb']:>13.0f}"
    )
    print()
    print(
        f"ingest: {ing['rows']} spans in {ing['seconds']:.2f}s, {ing['commits']} commits "
        f"(batch {args.batch_records} records); targets: 50,000 spans/s, 2,000 rollouts/s"
    )
    print(
        f"gold: {gold['rollouts']} rollouts -> {gold['rows']} transitions; trajectories {gold['traj_s']:.2f}s, "
        f"transitions {gold['trans_s']:.2f}s"
    )


if __name__ == "__main__":
    main()
