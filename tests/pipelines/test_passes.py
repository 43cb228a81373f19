"""A backlog read in passes (`update_trajectories(pass_records=...)`) builds what one pass builds.

Generated workloads: rollouts exported in pieces, the pieces of one trace on its partition in any order
among the others, some rollouts still running, over two runs; each run reads its backlog in passes of a
few records in one lake and in one pass in another, and both lakes must hold the same trajectories and
transitions. Also `offset_passes`, the cutting of offset ranges, against its own rules, and the partitions
`kafka_partitions` finds in the Delta log.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.gold.transitions_step import update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from pipelines.steps import offset_passes
from schemas.config import CreditSettings, KafkaSettings
from schemas.lake import Lake, kafka_partitions
from tests.pipelines.otel import Call, Rollout, encode, make_spans

KAFKA = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PARTITIONS = 2


def _pieces(seed: int, n: int, prefix: str) -> list[list[bytes]]:
    """Per partition, the records of ``n`` rollouts cut in 1-3 pieces each, in a shuffled order that
    keeps each trace's pieces on one partition."""
    rng = random.Random(seed)
    per_partition: list[list[bytes]] = [[] for _ in range(PARTITIONS)]
    for i in range(n):
        calls = [Call(prompt=[1, i, k], response=[2, k], logprobs=[-0.5, -0.25]) for k in range(rng.randint(1, 3))]
        r = Rollout(
            f"{prefix}{i}",
            task_id=f"task-{rng.randrange(3)}",
            calls=calls,
            final_reward=rng.choice([0.0, 1.0, None]),
            end_root=rng.random() < 0.8,
        )
        spans = make_spans(r)
        cuts = sorted(rng.sample(range(1, len(spans)), min(rng.randint(0, 2), len(spans) - 1)))
        pieces = [spans[a:b] for a, b in itertools.pairwise([0, *cuts, len(spans)])]
        per_partition[rng.randrange(PARTITIONS)].extend(encode(p) for p in pieces)
    for recs in per_partition:
        rng.shuffle(recs)
    return per_partition


def _ingest(lake: Lake, per_partition: list[list[bytes]], first: list[int]) -> None:
    recs = [
        KafkaRecord("s", p, first[p] + i, None, value, [])
        for p, values in enumerate(per_partition)
        for i, value in enumerate(values)
    ]
    txns = {f"kafka:s:{p}": first[p] + len(v) - 1 for p, v in enumerate(per_partition) if v}
    lake.write("spans", decode_spans(recs)[0], txns=txns)


def _tables(lake: Lake) -> tuple[pl.DataFrame, pl.DataFrame]:
    t = pl.read_delta(lake.uri("trajectories")).drop("updated_at").sort("tenant", "rollout_id")
    x = pl.read_delta(lake.uri("transitions")).drop("updated_at", "created_at", strict=False)
    return t, x.sort("tenant", "rollout_id", "step")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), first=st.integers(1, 7), second=st.integers(0, 5), pass_records=st.integers(1, 4))
def test_a_backlog_in_passes_builds_what_one_pass_builds(
    tmp_path: Path, seed: int, first: int, second: int, pass_records: int
) -> None:
    run = tmp_path / str(len(list(tmp_path.iterdir())))
    whole, passes = Lake(str(run / "whole")), Lake(str(run / "passes"))
    batches = [_pieces(seed, first, "a"), _pieces(seed + 1, second, "b")]
    offsets = [0] * PARTITIONS
    for batch in batches:
        for lake, size in ((whole, 10**9), (passes, pass_records)):
            _ingest(lake, batch, offsets)
            update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW, pass_records=size)
            update_transitions(lake, CreditSettings(), now=NOW)
        offsets = [o + len(v) for o, v in zip(offsets, batch, strict=True)]
        got, want = _tables(passes), _tables(whole)
        assert got[0].equals(want[0])
        assert got[1].equals(want[1])
    for p in range(PARTITIONS):  # both lakes read everything: the same watermarks
        assert passes.txn("trajectories", f"spans:s:{p}") == whole.txn("trajectories", f"spans:s:{p}")


@given(
    spans=st.dictionaries(
        st.integers(0, 5), st.tuples(st.one_of(st.none(), st.integers(0, 50)), st.integers(1, 40)), max_size=4
    ),
    size=st.integers(1, 30),
)
def test_offset_passes_cover_each_range_once_in_order(spans: dict[int, tuple[int | None, int]], size: int) -> None:
    """Each partition's range (offsets above ``lo`` up to ``hi``; ``lo`` None: from its first record,
    offset 0 here) in contiguous slices, in as many passes as ``size`` records need."""
    ranges = {p: (lo, (-1 if lo is None else lo) + n) for p, (lo, n) in spans.items()}
    passes = offset_passes(ranges, size, lambda p: -1)
    assert len(passes) == max(1, -(-sum(n for _, n in spans.values()) // size))
    for p, (lo, hi) in ranges.items():
        slices = [part[p] for part in passes if p in part]
        assert slices[0][0] == lo and slices[-1][1] == hi  # from where the reader stopped to the watermark
        assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))  # contiguous: no offset twice or missed
        widest = -(-spans[p][1] // len(passes))
        assert all(b - (-1 if a is None else a) <= widest for a, b in slices)  # the partition's share of a pass


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    commits=st.lists(
        st.lists(st.tuples(st.sampled_from(["s", "other"]), st.integers(0, 11)), min_size=1, max_size=6),
        min_size=1,
        max_size=4,
    )
)
def test_the_partitions_from_file_statistics_hold_every_partition_of_the_topic(
    tmp_path_factory: pytest.TempPathFactory, commits: list[list[tuple[str, int]]]
) -> None:
    """`kafka_partitions` reads the Delta log, not the rows: it names every partition the topic has rows in
    (and perhaps others, never one outside the files' range), the set the scan of the column gives."""
    root = tmp_path_factory.mktemp("parts")
    lake = Lake(str(root))
    offset = 0
    for commit in commits:
        recs = []
        for topic, p in commit:
            recs.append(KafkaRecord(topic, p, offset, None, encode(make_spans(Rollout(f"r{offset}"))), []))
            offset += 1
        table, _ = decode_spans(recs)
        lake.write("spans", table)
    spans = lake.table("spans")
    assert spans is not None
    rows = [(t, p) for c in commits for t, p in c]
    found = kafka_partitions(spans, "s")
    assert {p for t, p in rows if t == "s"} <= set(found)
    assert set(found) <= set(range(min(p for _, p in rows), max(p for _, p in rows) + 1))
    assert found == sorted(set(found))
