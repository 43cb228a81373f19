"""What the hourly compaction buys a gold step late in a busy day (issue 28): one replacement, before and after.

A day's `transitions` partition receives ``--commits`` small commits (one per lake run; 240 is an hour
of runs every 15 s, 5,760 a whole day), ``--rows`` transitions each. Then the step's replacement of a
chunk of stored groups is timed: the overwrite the transitions step commits, with its predicate
(``day >= <day> AND (tenant = .. AND group_id IN (..))``, pipelines.gold.transitions_step._replacement),
once on the day as the runs left it and once after ``compact_recent`` (what the ``hourly_compaction``
schedule runs), on fresh copies of the same table, alternating, medians of ``--runs``. The compaction's own
time is printed too. Same machine, same run: the ratio is what the schedule saves per run.

    .venv/bin/python benchmarks/bench_compaction.py --commits 240 --rows 90 --chunk 500 --runs 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402

from pipelines import keys  # noqa: E402
from pipelines.lake.compaction import compact_recent  # noqa: E402
from schemas.lake import Lake  # noqa: E402
from schemas.tables import TABLES  # noqa: E402

NOW = dt.datetime(2026, 11, 23, 23, 0, tzinfo=dt.UTC)  # late in the day: its partition holds the day's commits


def rows(commit: int, n: int, *, reward: float = 1.0) -> pa.Table:
    """``n`` transitions of one commit: rollouts of 3 steps, groups of 4 rollouts, in NOW's day."""
    out = []
    for i in range(n):
        rollout = f"c{commit}-r{i // 3}"
        out.append(
            {
                "transition_id": f"{rollout}/None/{i % 3}",
                "rollout_id": rollout,
                "tenant": "default",
                "group_id": f"c{commit}-g{i // 12}",
                "step": i % 3,
                "prompt_ids": list(range(64)),
                "response_ids": list(range(16)),
                "loss_mask": [1] * 16,
                "reward": reward,
                "return": reward,
                "advantage": 0.0,
                "token_source": "exact",
                "credit_mode": "identical",
                "advantage_mode": "grpo",
                "merged_calls": 1,
                "created_at": NOW,
                "day": NOW.date(),
            }
        )
    return pa.Table.from_pylist(out, schema=TABLES["transitions"])


def build(root: str, commits: int, per_commit: int) -> Lake:
    lake = Lake(root)
    for c in range(commits):
        lake.write("transitions", rows(c, per_commit))
    return lake


def replace_chunk(lake: Lake, commits: int, per_commit: int, chunk: int) -> float:
    """Seconds of one replacement of ``chunk`` stored transitions spread over the day's commits."""
    per = max(1, chunk // commits)
    picked = [rows(c, per_commit, reward=0.5).slice(0, per) for c in range(0, commits, max(1, commits * per // chunk))]
    new = pa.concat_tables(picked)
    groups = {(t, g) for t, g in zip(new.column("tenant").to_pylist(), new.column("group_id").to_pylist(), strict=True)}
    predicate = f"day >= '{NOW.date().isoformat()}' AND ({keys.predicate(groups, 'group_id')})"
    t0 = time.perf_counter()
    lake.write("transitions", new, mode="overwrite", predicate=predicate)
    took = time.perf_counter() - t0
    frame = lake.scan("transitions")
    assert frame is not None
    left = frame.filter(keys.among(groups, "group_id")).collect()  # untimed: the chunk was replaced
    assert left.height == new.num_rows and set(left["reward"]) == {0.5}, left
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=240, help="small commits in the day (lake runs)")
    ap.add_argument("--rows", type=int, default=90, help="transitions per commit")
    ap.add_argument("--chunk", type=int, default=500, help="stored transitions the timed replacement rewrites")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="agentlake-bench-compaction-")
    try:
        t0 = time.perf_counter()
        template = build(os.path.join(work, "template"), args.commits, args.rows)
        print(f"built {args.commits} commits x {args.rows} transitions in {time.perf_counter() - t0:.1f}s", flush=True)
        files = len(template.table("transitions").file_uris())  # type: ignore[union-attr]
        took: dict[str, list[float]] = {"as the runs left it": [], "after compact_recent": []}
        compaction: list[float] = []
        after_files = 0
        for run in range(args.runs):
            for case in took:
                root = os.path.join(work, f"run{run}-{case.split()[0]}")
                shutil.copytree(template.root, root)
                lake = Lake(root)
                if case == "after compact_recent":
                    t0 = time.perf_counter()
                    compact_recent(lake, days=1, now=NOW, tables=["transitions"])
                    compaction.append(time.perf_counter() - t0)
                    after_files = len(lake.table("transitions").file_uris())  # type: ignore[union-attr]
                took[case].append(replace_chunk(lake, args.commits, args.rows, args.chunk))
                shutil.rmtree(root)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in took.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(took["as the runs left it"])
    print(
        f"\none replacement of {args.chunk} stored transitions in a day of {args.commits} commits x {args.rows} "
        f"({args.commits * args.rows:,} transitions), {os.cpu_count()} CPUs, medians of {args.runs} runs"
    )
    print("| the day's partition | files | replacement s | x the uncompacted day |")
    print("| --- | --- | --- | --- |")
    for case, times in took.items():
        n = files if case == "as the runs left it" else after_files
        print(f"| {case} | {n} | {statistics.median(times):.2f} | {statistics.median(times) / base:.2f}x |")
    print(f"compact_recent itself: {statistics.median(compaction):.2f}s (median)")


if __name__ == "__main__":
    main()
