"""Point lookups of one rollout on big lakes whose ids are spread as real ids are (issue 28).

A user reads one rollout by id (the README's DuckDB query, the viewer's rollout page) and forgets one
(`agentlake forget`). Neither can be pruned by day: the id says nothing of when the rollout ran, and
its rewards may land days later. So what bounds them is how many rows each must read to find the
rollout. This benchmark builds lakes with spread ids (``benchmarks/lake_builder.py``, ``scatter``),
then times, on each lake as built and on a copy whose day partitions are clustered by ``rollout_id``
(``Lake.cluster``: sorted by the id into small row groups, whose min/max statistics let each reader
skip every row group but the one holding the id):

- the README's query ``SELECT ... FROM trajectories WHERE rollout_id = ...`` (``agentlake query``, DuckDB);
- the same row through Polars (``Lake.scan``, what the viewer reads);
- ``forget``'s plan (every table's scans for the rollout, its traces and responses) and the whole
  ``forget`` (deletes, the record, the vacuum).

Each figure is the median of ``--runs`` runs, each on another rollout of the lake's older copies.

    .venv/bin/python benchmarks/bench_point_lookups.py 100000 300000 1000000 --work /tmp/agentlake-bench-points
    .venv/bin/python benchmarks/bench_point_lookups.py --lake /tmp/agentlake-bench-increment/base10000000 --skip-polars
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polars as pl  # noqa: E402

from pipelines.lake.forget import Selector, forget, frames_of, plan, with_variants  # noqa: E402
from pipelines.lake.query import run_query  # noqa: E402
from schemas.lake import CLUSTER_ROW_GROUP_ROWS, Lake  # noqa: E402

TABLES = ("spans", "trajectories", "transitions")


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rollouts(lake: Lake, runs: int) -> list[str]:
    """``runs`` rollout ids of the oldest copies (untimed): one per run, each forgotten once."""
    scan = lake.scan("trajectories")
    assert scan is not None
    ids = scan.filter(pl.col("rollout_id").str.contains(r"-c[0-3]-roll-\d+$")).select("rollout_id").collect()
    return sorted(ids["rollout_id"].to_list())[: runs * 7 : 7][:runs]


def _files(lake: Lake) -> int:
    return sum(len(t.file_uris()) for n in TABLES if (t := lake.table(n)) is not None)


def measure(lake: Lake, runs: int, *, polars: bool = True) -> dict[str, float]:
    """Median seconds of each lookup on ``lake``; forgets ``runs`` rollouts of it. ``polars=False`` leaves
    out the Polars read of a whole row (a minute at 10M)."""
    times: dict[str, list[float]] = {"query": [], "polars": [], "plan": [], "forget": []}
    for rid in _rollouts(lake, runs):
        sql = f"SELECT rollout_id, n_llm_calls, final_reward FROM trajectories WHERE rollout_id = '{rid}'"
        times["query"].append(_seconds(lambda sql=sql: run_query(lake, sql)))
        scan = lake.scan("trajectories")
        assert scan is not None
        if polars:
            times["polars"].append(_seconds(lambda s=scan, r=rid: s.filter(pl.col("rollout_id") == r).collect()))
        sel = with_variants(lake, Selector("forget", tenant="default", rollout=rid))
        t0 = time.perf_counter()
        planned = plan(sel, frames_of(lake, sel.tables))
        times["plan"].append(time.perf_counter() - t0)
        assert planned.rows > 0, f"rollout {rid} not found: the benchmark would time nothing"
        times["forget"].append(_seconds(lambda r=rid: forget(lake, "default", rollout=r, reason="benchmark")))
    return {k: statistics.median(v) if v else float("nan") for k, v in times.items()}


def _build(root: str, sizes: list[int]) -> None:
    """Build the missing lakes (spread ids) from the template bench_increment's steps make."""
    from benchmarks.lake_builder import build_lake, ensure_template

    template = ensure_template(root)
    for n in sizes:
        path = os.path.join(root, f"spread{n}")
        if not os.path.isdir(path):
            print(f"building a lake of {n:,} rollouts with spread ids ...", flush=True)
            build_lake(template, Lake(path), n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sizes", nargs="*", type=int, help="lake sizes in rollouts")
    ap.add_argument(
        "--lake", help="time a lake already built (e.g. bench_increment's base10000000) as built, on a hard-linked copy"
    )
    ap.add_argument("--skip-polars", action="store_true", help="leave out the Polars read of a whole row")
    ap.add_argument("--work", default="/tmp/agentlake-bench-points")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--row-group", type=int, default=CLUSTER_ROW_GROUP_ROWS, help="rows per row group when clustering")
    args = ap.parse_args()
    if args.lake:
        work = os.path.join(args.work, "linked")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(args.lake, work, copy_function=os.link)  # Delta never rewrites a file in place
        got = measure(Lake(work), args.runs, polars=not args.skip_polars)
        shutil.rmtree(work, ignore_errors=True)
        print("| lake | README query s | Polars read s | forget plan s | forget s |\n|---|---|---|---|---|")
        print(f"| {args.lake} | {got['query']:.3f} | {got['polars']:.3f} | {got['plan']:.2f} | {got['forget']:.2f} |")
        return
    if not args.sizes:
        ap.error("give the lake sizes to build and time, or --lake PATH for a lake already built")
    _build(args.work, args.sizes)
    rows = []
    for n in args.sizes:
        for layout in ("as built", "clustered"):
            work = os.path.join(args.work, "run")
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(os.path.join(args.work, f"spread{n}"), work)
            lake = Lake(work)
            t0 = time.perf_counter()
            if layout == "clustered":
                for t in TABLES:
                    lake.cluster(t, row_group_rows=args.row_group)
            cluster_s = time.perf_counter() - t0
            got = measure(lake, args.runs)
            rows.append((n, layout, _files(lake), cluster_s, got))
            print(f"{n:,} {layout}: {got}", flush=True)
    print()
    head = ["lake rollouts", "layout", "files", "clustering s", "README query s", "Polars read s"]
    print("| " + " | ".join([*head, "forget plan s", "forget s"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for n, layout, files, cluster_s, got in rows:
        print(
            f"| {n:,} | {layout} | {files} | {cluster_s:.1f} | {got['query']:.3f} | {got['polars']:.3f} "
            f"| {got['plan']:.2f} | {got['forget']:.2f} |"
        )


if __name__ == "__main__":
    main()
