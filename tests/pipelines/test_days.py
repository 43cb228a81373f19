"""Re-assembling a rollout reads only the `day` partitions its spans can be in, and misses none."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl

from pipelines.bronze.decoding import KafkaRecord, SpanBatch
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import KafkaSettings
from schemas.lake import Lake
from tests.pipelines.otel import MS, Call, Rollout, encode, make_spans

DAY_NS = 86_400_000 * MS
T0 = Rollout("t").t0_ns  # the test rollouts' default start


def ingest_direct(lake: Lake, topic: str, rollouts: list[Rollout], first_offset: int) -> None:
    """What ingestion commits, without a broker: decoded rows plus the offset as an app transaction."""
    batch = SpanBatch()
    for i, r in enumerate(rollouts):
        batch.add(KafkaRecord(topic, 0, first_offset + i, None, encode(make_spans(r)), []))
    lake.write("spans", batch.to_table(), txns={f"kafka:{topic}:0": first_offset + len(rollouts) - 1})


def test_rollout_spanning_days_is_assembled_whole(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")
    lake = Lake(str(tmp_path / "lake"))
    now = dt.datetime.fromtimestamp((T0 + 30 * DAY_NS) / 1e9, dt.UTC)
    old = Rollout("other", calls=[Call(prompt=[1], response=[2])], t0_ns=T0 - 20 * DAY_NS)
    first = Rollout("x", calls=[Call(prompt=[1], response=[2], response_id="a")], t0_ns=T0, end_root=False)
    ingest_direct(lake, "s", [old, first], 0)
    update_trajectories(lake, kafka, idle_timeout_s=1e9, now=now)

    # days later, more spans of "x" and, in another run, one that started the day before
    later = Rollout("x", calls=[Call(prompt=[3], response=[4], response_id="b")], t0_ns=T0 + 2 * DAY_NS)
    ingest_direct(lake, "s", [later], 2)
    update_trajectories(lake, kafka, idle_timeout_s=1e9, now=now)
    earlier = Rollout("x", calls=[Call(prompt=[5], response=[6], response_id="c")], t0_ns=T0 - DAY_NS, end_root=False)
    ingest_direct(lake, "s", [earlier], 3)
    update_trajectories(lake, kafka, idle_timeout_s=1e9, now=now)

    spans = pl.read_delta(lake.uri("spans"))
    traj = pl.read_delta(lake.uri("trajectories")).sort("rollout_id")
    assert traj["rollout_id"].to_list() == ["other", "x"]
    x = traj.row(1, named=True)
    assert x["n_spans"] == spans.filter(pl.col("rollout_id") == "x").height
    assert x["n_llm_calls"] == 3
    assert x["day"] == dt.datetime.fromtimestamp((T0 - DAY_NS) / 1e9, dt.UTC).date()
    assert x["status"] == "finished"
