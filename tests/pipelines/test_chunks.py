"""Trajectories and transitions built in small chunks (one commit each) equal the one-chunk build."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.gold.transitions_step import BASELINE_KEY, saved_baseline, update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from pipelines.steps import group_chunks
from schemas.config import CreditSettings, KafkaSettings
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, encode, make_spans

KAFKA = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")


def records() -> list[KafkaRecord]:
    """Five tasks of uneven size (1 to 5 samples), rewards spread so every group has an advantage."""
    out = []
    for task in range(5):
        for sample in range(task + 1):
            call = Call(prompt=[1, task], response=[2, sample], logprobs=[-0.5, -0.25])
            r = Rollout(f"t{task}-s{sample}", task_id=f"t{task}", calls=[call], final_reward=sample / 4)
            out.append(KafkaRecord("s", 0, len(out), None, encode(make_spans(r)), []))
    return out


Built = tuple[pl.DataFrame, pl.DataFrame, dict[str, object], int]


def build(root: Path, recs: list[KafkaRecord], chunk: int | None, credit: CreditSettings | None = None) -> Built:
    lake = Lake(str(root))
    lake.write("spans", decode_spans(recs)[0], txns={"kafka:s:0": len(recs) - 1})
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    kw = {} if chunk is None else {"chunk_rollouts": chunk}
    traj = update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=now, **kw)
    trans = update_transitions(lake, credit or CreditSettings(), now=now, **kw)
    ignore = ["updated_at"]
    t = pl.read_delta(lake.uri("trajectories")).drop(ignore).sort("rollout_id")
    x = pl.read_delta(lake.uri("transitions")).drop(ignore, strict=False).sort("rollout_id", "step")
    assert traj.extra["finished"] == 15
    return t, x, trans.extra, lake.version("transitions") or 0


def test_chunked_steps_write_what_one_chunk_writes(tmp_path: Path) -> None:
    recs = records()
    t1, x1, meta1, v1 = build(tmp_path / "one", recs, None)
    t4, x4, meta4, v4 = build(tmp_path / "small", recs, 4)
    assert t1.equals(t4)
    assert x1.drop("created_at", strict=False).equals(x4.drop("created_at", strict=False))
    assert x1.height == 15
    assert meta1["commits"] == 1 and meta4["commits"] == 4  # groups of 1+2 | 3 | 4 | 5 rollouts
    assert meta1["reward_mean"] == meta4["reward_mean"]
    assert v4 == v1 + 3


def test_group_chunks_keep_groups_whole() -> None:
    assert group_chunks(["a", "b", "c", "d"], [1, 2, 5, 1], 3) == [["a", "b"], ["c"], ["d"]]
    assert group_chunks([], [], 3) == []


def test_running_baseline_is_saved_once_per_run_and_survives_compaction(tmp_path: Path) -> None:
    """Chunked or not, the run ends on the same baseline; only the last chunk's commit carries it
    (a rerun after a crash between chunks starts from the previous run's), and a compaction commit
    on top does not make the next run start it over."""
    recs = records()
    credit = CreditSettings(advantage="running_baseline")
    _, x1, _, _ = build(tmp_path / "one", recs, None, credit)
    _, x4, _, v4 = build(tmp_path / "small", recs, 4, credit)
    assert x1.drop("created_at", strict=False).equals(x4.drop("created_at", strict=False))
    one, small = Lake(str(tmp_path / "one")), Lake(str(tmp_path / "small"))
    saved = saved_baseline(small)
    assert saved is not None and saved == saved_baseline(one)
    table = small.table("transitions")
    assert table is not None
    carrying = [c.get("version") for c in table.history() if BASELINE_KEY in c]
    assert carrying == [v4]  # the last of the four chunk commits only
    table.optimize.compact()
    assert small.version("transitions") == v4 + 1 and saved_baseline(small) == saved
