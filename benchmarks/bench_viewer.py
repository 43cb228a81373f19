"""Viewer benchmark: each page's latency (p50/p95) over HTTP on a lake of ``--rollouts`` rollouts (1M by default).

The lake is built once with the pipeline benchmark's generator and steps: ``--template`` rollouts through
Kafka and the pipeline (``bench_pipelines.produce_rollouts``: OTel SDK spans into a local broker;
``bench_pipelines._fill``: ingestion, trajectories, transitions), copied up to ``--rollouts`` straight to Delta
(``lake_builder.build_lake``: new ids, times spread ``--per-day`` a day), then a registry line of ``--versions``
versions (trainer.registry), each with the rollouts it trained on (trainer.lineage). It is kept at ``--lake``
(built only when that folder holds no `transitions`), so pages can be timed again without rebuilding. The
viewer (``viewer.app.create_app``) is served by uvicorn on localhost; each page is requested once ("first":
DuckDB's views and the tokenizer load) and then ``--requests`` times (p50, p95).

    nice -n 10 .venv/bin/python benchmarks/bench_viewer.py --rollouts 1000000 --lake /tmp/agentlake-viewer-1m

The goal (issue 27): every page under 1 s at p95 on a 1M-rollout lake.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402
import polars as pl  # noqa: E402
import uvicorn  # noqa: E402

from benchmarks.bench_pipelines import _fill, in_child, produce_rollouts  # noqa: E402
from benchmarks.lake_builder import build_lake  # noqa: E402
from collectors.listen import QuietServer, bind  # noqa: E402
from schemas.config import KafkaSettings, load_settings  # noqa: E402
from schemas.lake import Lake  # noqa: E402


def build(lake: Lake, args: argparse.Namespace) -> None:
    """The pipeline benchmark's lake: ``--template`` rollouts produced into a local broker and run through the
    pipeline (``bench_pipelines``), then copied up to ``--rollouts`` (``lake_builder.build_lake``)."""
    from agentlake.stack.broker import LocalBroker, ensure_topics

    template = Lake(lake.root.rstrip("/") + "-template")
    if template.table("transitions") is None:
        broker = LocalBroker().start()
        try:
            suffix = str(int(time.time()))
            kafka = KafkaSettings(
                bootstrap_servers=broker.bootstrap, spans_topic=f"bv.spans.{suffix}", rewards_topic=f"bv.r.{suffix}"
            )
            ensure_topics(kafka, broker.bootstrap, [kafka.spans_topic, kafka.rewards_topic])
            produce_rollouts(kafka, args.template, args.calls, args.prompt_len, args.response_len)
            in_child(functools.partial(_fill, template, kafka, -(-args.template // args.batch_records), args))
        finally:
            broker.stop()
    built = in_child(functools.partial(build_lake, template, lake, args.rollouts, per_day=args.per_day))
    print(f"  {built['rollouts']:,} rollouts copied in {built['seconds']:.0f}s", flush=True)


def add_versions(lake: Lake, n: int) -> None:
    """A registry line of ``n`` versions, each trained on a consecutive slice of the rollouts (its lineage)."""
    from trainer.lineage import Lineage
    from trainer.registry import Registry

    reg, lineage = Registry(lake), Lineage(lake)
    ids = pl.scan_delta(lake.uri("transitions")).select("transition_id", "rollout_id").collect()
    size = ids.height // n
    for k in range(1, n + 1):
        version = f"v{k:04d}"
        reg.add(
            version=version, version_number=k, base_model="smollm2-135m", kind="lora", path=f"/ckpt/{version}",
            parent_version=f"v{k - 1:04d}" if k > 1 else None, served_name="policy",
            train_table=lake.uri("transitions"), n_transitions=size,
        )  # fmt: skip
        rows = ids.slice((k - 1) * size, size)
        table = lake.uri("transitions")
        lineage.record(model_version=version, train_table=table, table_version=0, rows=rows.to_arrow())
        reg.set_status(version, "published")


def pages(lake: Lake) -> dict[str, str]:
    """The paths timed: each page, the list with and without filters, one rollout and one version."""
    cols = ["rollout_id", "task_id", "start_time"]
    row = pl.scan_delta(lake.uri("trajectories")).select(cols).head(1).collect().row(0, named=True)
    one, task, day = row["rollout_id"], row["task_id"], row["start_time"].date()
    return {
        "rollouts": "/rollouts",
        "rollouts, page 50": "/rollouts?page=50",
        "rollouts, agent+task": f"/rollouts?agent=solver&task={task}",
        "rollouts, reward range": "/rollouts?reward_min=0.5&reward_max=1&sort=reward",
        "rollouts, status+version": "/rollouts?status=finished&policy_version=v0",
        "rollouts, one day": f"/rollouts?since={day}&until={day + dt.timedelta(days=1)}",
        "rollouts, search by id": f"/rollouts?q={one}",
        "one rollout": f"/rollouts/{one}",
        "versions": "/versions",
        "one version": "/versions/v0005",
        "health": "/health",
    }


def serve(lake: Lake) -> tuple[str, QuietServer, threading.Thread]:
    from viewer.app import create_app

    with tempfile.TemporaryDirectory() as state:
        settings = load_settings(environ={}, discover=False, overrides={"state": {"dir": state}})
    app = create_app(settings, lake)
    sock = bind("127.0.0.1", 0)
    server = QuietServer(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1_000_000)
    ap.add_argument("--lake", default=os.path.join(tempfile.gettempdir(), "agentlake-bench-viewer"))
    ap.add_argument("--template", type=int, default=5000, help="rollouts through Kafka and the pipeline, then copied")
    ap.add_argument("--per-day", type=int, default=30_000, help="rollouts a day in the built lake")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=8)
    ap.add_argument("--batch-records", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=None, help="ingestion's decoder processes (default: its own)")
    ap.add_argument("--versions", type=int, default=10)
    ap.add_argument("--requests", type=int, default=20, help="timed requests per page (after one warm-up)")
    args = ap.parse_args()

    lake = Lake(str(Path(args.lake).resolve()))
    if lake.table("transitions") is None:
        t0 = time.perf_counter()
        print(f"building {args.rollouts:,} rollouts at {lake.root}", flush=True)
        build(lake, args)
        print(f"built in {time.perf_counter() - t0:.0f}s", flush=True)
    if lake.table("model_versions") is None:  # also on a lake whose build was stopped between chunks
        add_versions(lake, args.versions)
    n = pl.scan_delta(lake.uri("trajectories")).select(pl.len()).collect().item()
    base, server, thread = serve(lake)
    rows = []
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            for name, path in pages(lake).items():
                first = time.perf_counter()
                status = client.get(path).status_code
                cold = time.perf_counter() - first
                times = []
                for _ in range(args.requests):
                    t0 = time.perf_counter()
                    r = client.get(path)
                    times.append(time.perf_counter() - t0)
                    status = max(status, r.status_code)
                rows.append((name, path, status, cold, pct(times, 50), pct(times, 95)))
                print(f"  {name}: p95 {rows[-1][5] * 1000:.0f} ms", flush=True)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    print()
    print(f"{n:,} rollouts at {lake.root}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'page':<28}{'status':>7}{'first ms':>10}{'p50 ms':>9}{'p95 ms':>9}  path")
    for name, path, status, cold, p50, p95 in rows:
        flag = "" if p95 < 1.0 else "  > 1 s"
        print(f"{name:<28}{status:>7}{cold * 1000:>10.0f}{p50 * 1000:>9.0f}{p95 * 1000:>9.0f}  {path}{flag}")


if __name__ == "__main__":
    main()
