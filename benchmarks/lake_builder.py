"""A big lake in minutes: copies of a real increment, written straight to Delta (no Kafka, no steps).

The pipeline benchmark times one increment on top of a lake of N rollouts. Building N rollouts
through Kafka and the steps takes as long as N increments, so instead the increment's own lake
(built by the real steps from the benchmark's generator) is the template: each copy renames its
ids (rollout, task, group, attempt, trace, response, transition), moves its offsets past the
copies before it and its times and ``day`` back by whole days (``--per-day`` rollouts a day, the
newest copies yesterday), and is appended to `spans`, `trajectories` and `transitions`. The copies
come from an older topic (``old_topic``) whose watermarks go in with the last copy, and the
transitions step's marks (``trajectories`` version and ``updated_at``) with the last
`transitions` copy: the lake looks to the steps as if they had consumed all of it already.

What it does not imitate: the copies are one file per table, day and copy (a compacted lake),
not the many small commits of real ingestion.

Ids: with ``scatter`` (the default) each copy's rollout ids and trace ids start with a hash of the
copy and the id, so they are spread over every file's range as uuids and random trace ids are in real
traffic. Without it they start with the copy's number, which makes each file's min/max statistics
cover one copy only: a point lookup by id then skips every other file, which real traffic never allows.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import polars as pl

from pipelines.bronze.positions import app_id
from pipelines.gold.transitions_step import TRAJ_FROM_TRANSITIONS, TRAJ_VERSION
from schemas.lake import Lake

_PREFIXED = ["rollout_id", "task_id", "group_id", "attempt_id", "transition_id", "llm_response_id"]


def _spread(k: int, value: pl.Expr) -> pl.Expr:
    """Eight digits that depend on the copy and the value: a prefix that scatters ids over the key space."""
    return (pl.lit(f"c{k}-") + value).hash(seed=7).cast(pl.String).str.zfill(20).str.slice(12, 8)


def _copy(
    df: pl.DataFrame, k: int, days_back: int, offset_shift: int, old_topic: str, *, scatter: bool = True
) -> pl.DataFrame:
    """Copy ``k`` of a template table: new ids, offsets and times (``days_back`` whole days earlier)."""
    delta = dt.timedelta(days=days_back)
    tag = f"{k:08x}"

    def trace(value: pl.Expr) -> pl.Expr:
        return (_spread(k, value) if scatter else pl.lit(tag)) + value.str.slice(8)

    exprs: list[pl.Expr] = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if name in _PREFIXED:
            exprs.append(((_spread(k, col) + pl.lit(f"-c{k}-") if scatter else pl.lit(f"c{k}-")) + col).alias(name))
        elif name == "trace_id":
            exprs.append(trace(col).alias(name))
        elif name == "trace_ids":
            exprs.append(col.list.eval(trace(pl.element())).alias(name))
        elif name == "kafka_topic":
            exprs.append(pl.lit(old_topic).alias(name))
        elif name == "kafka_offset":
            exprs.append((col + offset_shift).alias(name))
        elif name == "day" or isinstance(dtype, pl.Datetime):
            exprs.append((col - delta).alias(name))
    return df.with_columns(exprs)


def build_lake(
    template: Lake,
    lake: Lake,
    rollouts: int,
    *,
    per_day: int = 30_000,
    old_topic: str = "bench.spans.old",
    scatter: bool = True,
    same_day: bool = False,
) -> dict[str, Any]:
    """Append copies of ``template``'s rollouts to ``lake`` until it holds at least ``rollouts``.

    ``same_day``: every copy on the template's own day (``per_day`` ignored), as the increments of one
    busy day pile up in its partition, where pruning by day does not help.
    """
    t0 = time.perf_counter()
    frames = {n: pl.read_delta(template.uri(n)) for n in ("spans", "trajectories", "transitions")}
    per_copy = frames["trajectories"].height
    copies = -(-rollouts // per_copy)
    stride = int(frames["spans"]["kafka_offset"].max()) + 1  # type: ignore[arg-type]
    parts = sorted(frames["spans"]["kafka_partition"].unique().to_list())
    for k in range(copies):
        # the newest copies one day back, older ones further: per_day rollouts a day
        days_back = 0 if same_day else 1 + (copies - 1 - k) * per_copy // per_day
        last = k == copies - 1
        for name in ("spans", "trajectories", "transitions"):
            txns: dict[str, int] | None = None
            if last and name == "spans":
                txns = {app_id(old_topic, p): (k + 1) * stride - 1 for p in parts}
            elif last and name == "trajectories":
                txns = {f"spans:{old_topic}:{p}": (k + 1) * stride - 1 for p in parts}
            elif last and name == "transitions":
                traj = lake.table("trajectories")
                assert traj is not None
                newest = pl.scan_delta(traj).select(pl.col("updated_at").dt.epoch("us").max()).collect().item()
                txns = {TRAJ_VERSION: traj.version(), TRAJ_FROM_TRANSITIONS: int(newest)}
            data = _copy(frames[name], k, days_back, k * stride, old_topic, scatter=scatter)
            lake.write(name, data.to_arrow(), txns=txns)
    return {"rollouts": copies * per_copy, "copies": copies, "seconds": time.perf_counter() - t0}


def ensure_template(root: str, rollouts: int = 10_000) -> Lake:
    """The template lake under ``root``: the real steps on bench_increment's first ``rollouts`` rollouts
    (made once; ``template`` for the default 10,000, ``template<rollouts>`` otherwise)."""
    import os

    from benchmarks.bench_increment import KAFKA, PARTITIONS, increment_spans  # lazy: it imports this module
    from pipelines.gold.transitions_step import update_transitions
    from pipelines.silver.trajectories_step import update_trajectories
    from schemas.config import CreditSettings

    os.makedirs(root, exist_ok=True)
    template = Lake(os.path.join(root, "template" if rollouts == 10_000 else f"template{rollouts}"))
    if not os.path.exists(template.root):
        spans = increment_spans(os.path.join(root, f"inc{rollouts}.parquet"), rollouts).to_arrow()
        last = (rollouts - 1) // PARTITIONS
        template.write("spans", spans, txns={app_id("new", p): last for p in range(PARTITIONS)})
        update_trajectories(template, KAFKA, idle_timeout_s=300)
        update_transitions(template, CreditSettings())
    return template
