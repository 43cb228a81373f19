"""The lake-scanning paths outside the steps, on built lakes (issue 28): seconds per path and lake size.

Each lake (``benchmarks/lake_builder.py``, kept under ``--work`` as bench_increment keeps them) is
copied, marked as trained on up to its last version (a registry row and every transition in
``training_lineage``, as a round leaves them), and given one increment (the template's 10,000
rollouts' transitions, new ids) in a new commit. Timed: the trainer's pending count with the settled
files skipped and with every file read (as before), the Kafka sensor's pending check (positions from
the Delta log) and its reward-horizon check, the README's reward-per-agent query, and data file counts.

    .venv/bin/python benchmarks/bench_lake_scans.py 100000 300000 1000000 --work /tmp/h6-lakes

Missing lakes (and the template) are built first, as bench_increment builds them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402

from pipelines.defs.automation import pending  # noqa: E402
from pipelines.gold.reward_horizon import horizon_due  # noqa: E402
from pipelines.lake.query import run_query  # noqa: E402
from schemas.config import CreditSettings  # noqa: E402
from schemas.lake import Lake  # noqa: E402
from schemas.tables import TRAINING_LINEAGE  # noqa: E402
from schemas.uris import normalize_uri  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import read_transitions  # noqa: E402
from trainer.lineage import Lineage  # noqa: E402
from trainer.registry import Registry  # noqa: E402
from trainer.round import count_pending  # noqa: E402

T = TypeVar("T")
README_QUERY = "SELECT agent_name, avg(reward) FROM transitions GROUP BY 1"
REWARD_BY_DAY = "SELECT agent_name, day, avg(reward) FROM transitions GROUP BY 1, 2 ORDER BY 2, 1"


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _files(lake: Lake, table: str) -> int:
    dt = lake.table(table)
    return 0 if dt is None else len(dt.file_uris())


def _lineage(part: pl.DataFrame, uri: str, version: int, day: dt.date) -> pa.Table:
    at = dt.datetime.combine(day, dt.time(1), tzinfo=dt.UTC)
    rows = part.select(
        pl.lit("v0001").alias("model_version"),
        "transition_id",
        "rollout_id",
        pl.lit(normalize_uri(uri)).alias("train_table"),
        pl.lit(version, pl.Int64).alias("table_version"),
        pl.lit(at).alias("consumed_at"),
    )
    return rows.to_arrow().cast(TRAINING_LINEAGE)


def one(n: int, root: str) -> None:
    """One row: the paths timed on a trained copy of the lake of ``n`` rollouts plus one increment."""
    lake = Lake(os.path.join(root, "scan"))
    shutil.rmtree(lake.root, ignore_errors=True)
    shutil.copytree(os.path.join(root, f"base{n}"), lake.root, copy_function=os.link)  # as bench_increment: hard links
    trained = lake.table("transitions")
    assert trained is not None
    end = trained.version()
    keys = pl.scan_delta(trained).select("transition_id", "rollout_id", "day").collect()
    Registry(lake).add(
        version="v0001",
        version_number=1,
        base_model="bench",
        kind="lora",
        path="/nowhere",
        train_table=lake.uri("transitions"),
        train_version_start=-1,
        train_version_end=end,
        n_transitions=keys.height,
        config=TrainConfig(lake_root=lake.root, base_model="bench").recorded(),
    )
    # one lineage commit per day, consumed an hour after the day began: as daily rounds leave it
    for (day,), part in keys.sort("day").group_by("day", maintain_order=True):
        lake.write("training_lineage", _lineage(part, lake.uri("transitions"), end, day))
    inc = pl.read_delta(os.path.join(root, "template", "transitions"))
    inc = inc.with_columns(*((pl.lit("inc-") + pl.col(c)).alias(c) for c in ("transition_id", "rollout_id")))
    lake.write("transitions", inc.to_arrow())
    cfg = TrainConfig(lake_root=lake.root, base_model="bench")
    t_new, (count, _) = _timed(lambda: count_pending(cfg))
    consumed = Lineage(lake).consumed_ids(lake.uri("transitions"))
    t_old, old = _timed(lambda: read_transitions(lake, exclude_ids=consumed, ids_only=True))
    assert count == inc.height == old.rows.num_rows, (count, inc.height, old.rows.num_rows)
    t_lin, _ = _timed(lambda: Lineage(lake).consumed_ids(lake.uri("transitions")))
    hints = {p: 0 for p in range(4)}
    t_sensor, _ = _timed(lambda: pending(lake, "spans", "bench.spans.old", hints))
    credit = CreditSettings(reward_horizon_s=3600)
    t_horizon, _ = _timed(lambda: horizon_due(lake, credit))
    t_r, _ = _timed(lambda: run_query(lake, README_QUERY))
    t_q, _ = _timed(lambda: run_query(lake, REWARD_BY_DAY))
    print(
        f"{n:>10,}{keys.height:>12,}{t_new:>10.2f}{t_old + t_lin:>10.2f}{t_lin:>10.2f}{t_sensor:>10.3f}"
        f"{t_horizon:>10.2f}{t_r:>10.2f}{t_q:>10.2f}{_files(lake, 'transitions'):>9}{_files(lake, 'spans'):>9}",
        flush=True,
    )
    # compaction after small commits: the increment again as 20 commits of 1,500 rows (new ids), twice:
    # the first compaction also merges the built lake's per-copy files, the second is the nightly steady state
    for night in ("first", "next"):
        tag = pl.lit(f"{night}-")
        small = inc.with_columns(*((tag + pl.col(c)).alias(c) for c in ("transition_id", "rollout_id")))
        for k in range(20):
            lake.write("transitions", small.slice(k * 1_500, 1_500).to_arrow())
        before = _files(lake, "transitions")
        t_c, m = _timed(lambda: lake.compact("transitions"))
        after, rewritten = _files(lake, "transitions"), (m or {}).get("numFilesRemoved")
        print(f"{'':>10}{night} compaction: {before} -> {after} files ({rewritten} rewritten) in {t_c:.2f} s")
    shutil.rmtree(lake.root, ignore_errors=True)


def _build(root: str, sizes: list[int]) -> None:
    """The template (the real steps on bench_increment's 10,000 rollouts) and each missing lake."""
    from benchmarks.lake_builder import build_lake, ensure_template

    template = ensure_template(root)
    for n in sizes:
        if not os.path.exists(os.path.join(root, f"base{n}")):
            build_lake(template, Lake(os.path.join(root, f"base{n}")), n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, help="lake sizes in rollouts (built lakes under --work)")
    ap.add_argument("--work", default="/tmp/agentlake-bench-increment")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        return one(args.one, args.work)
    heads = ("rollouts", "lineage", "pend s", "pend old", "lineage s", "sensor s", "horizon s", "README s", "by day s")
    print(
        "".join(f"{h:>10}" if i != 1 else f"{h:>12}" for i, h in enumerate(heads)) + f"{'tr files':>9}{'sp files':>9}"
    )
    for n in args.sizes:
        subprocess.run([sys.executable, __file__, "--one", str(n), "--work", args.work], check=True)


if __name__ == "__main__":
    main()
