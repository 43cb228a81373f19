"""Two ingestion runs at once stay exactly-once: the loser fails before its rows land.

Issue 14, finding 10: two `dagster asset materialize` runs on one backlog committed a batch twice
(two Delta versions carried the same partition offset, and the watermark went backwards). Here two
real ``ingest`` calls race on one backlog in a real broker and a real Delta table, a few times over.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipelines.bronze.ingest import ingest
from pipelines.bronze.positions import app_id
from pipelines.bronze.span_rewards import extract_span_rewards
from schemas.config import Settings
from schemas.errors import ConcurrentWriteError
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record

N_RECORDS = 800
TRIALS = 3


def _txn_history(uri: str) -> dict[str, list[tuple[int, int]]]:
    """(Delta version, value) of every app transaction in the table's log, in commit order."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for f in sorted(Path(uri, "_delta_log").glob("*.json")):
        version = int(f.name.split(".")[0])
        for line in f.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn:
                seen.setdefault(txn["appId"], []).append((version, txn["version"]))
    return seen


def _race(fn: Callable[[], object]) -> list[object]:
    """``fn`` in two threads started together: what each returned, or the ConcurrentWriteError it lost with."""
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def run() -> None:
        start.wait()
        try:
            outcomes.append(fn())
        except ConcurrentWriteError as exc:  # the loser: refused before its rows landed
            outcomes.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == 2, outcomes
    return outcomes


@pytest.mark.kafka
def test_two_ingestions_at_once_write_each_record_once(settings: Settings, tmp_path: Path) -> None:
    k = settings.kafka
    records, n_spans = [], 0
    for i in range(N_RECORDS):
        spans = make_spans(Rollout(f"c{i}", task_id="t", calls=[Call(prompt=[i], response=[2])], final_reward=1.0))
        n_spans += len(spans)
        records.append(span_record(spans, key=f"c{i}"))
    produce(k, k.spans_topic, records)

    for trial in range(TRIALS):
        lake = Lake(str(tmp_path / f"lake{trial}"))
        outcomes = _race(lambda lake=lake: ingest(lake, k, "spans", batch_records=40, workers=0).records)
        # whatever both left (when each lost some partitions to the other), a later run finishes
        ingest(lake, k, "spans", workers=0)

        df = pl.read_delta(lake.uri("spans"))
        assert df.height == n_spans, f"trial {trial}: {df.height - n_spans} extra rows ({outcomes})"
        assert df.select(pl.struct("kafka_partition", "kafka_offset", "span_id").n_unique()).item() == n_spans
        offsets = pl.col("kafka_offset")
        per = df.group_by("kafka_partition").agg(offsets.n_unique().alias("n"), offsets.max())
        assert per["n"].sum() == N_RECORDS
        dt = DeltaTable(lake.uri("spans"))
        history = _txn_history(lake.uri("spans"))
        for p, n, hi in per.iter_rows():
            assert n == hi + 1
            assert dt.transaction_version(app_id(k.spans_topic, p)) == hi
            marks = [v for _, v in history[app_id(k.spans_topic, p)]]
            assert marks == sorted(set(marks)), f"partition {p}: an offset committed twice or backwards: {marks}"

        # the copy of reward spans into `rewards`, twice at once, is exactly-once too
        _race(lambda lake=lake: extract_span_rewards(lake, k.spans_topic))
        extract_span_rewards(lake, k.spans_topic)
        got = pl.read_delta(lake.uri("rewards"))
        assert got.height == got["reward_id"].n_unique() == df["reward_value"].is_not_null().sum() == N_RECORDS


def test_a_commit_never_moves_a_watermark_back(tmp_path: Path) -> None:
    """The lake refuses a position below the one its snapshot holds, and one another writer moved since."""
    from schemas.tables import SPANS

    lake = Lake(str(tmp_path / "lake"))
    empty = pa.Table.from_pylist([], schema=SPANS)
    assert_snapshot_rules(lake, empty)


def test_ingestion_is_serialized_and_duplicates_block_downstream() -> None:
    """Dagster side: one ingestion per table at a time (a pool of one slot), blocking uniqueness checks."""
    from dagster._core.instance.config import dagster_instance_config

    from pipelines.defs.assets import rewards, spans
    from pipelines.defs.checks import rewards_unique, spans_unique

    home = Path(__file__).resolve().parents[2] / "dagster_home"
    config, _ = dagster_instance_config(str(home))
    pools = config["concurrency"]["pools"]
    assert pools["default_limit"] == 1 and pools["granularity"] == "op"
    assert spans.op.pool == "agentlake-spans" and rewards.op.pool == "agentlake-rewards"
    for check in (spans_unique, rewards_unique):
        assert all(spec.blocking for spec in check.check_specs)


def assert_snapshot_rules(lake: Lake, empty: pa.Table) -> None:
    """``Lake.write`` refuses a position below its snapshot's, and one another writer moved since.

    Shared with tests/lake/test_concurrent_writers.py, which runs the same rules on the object store.
    """
    lake.write("spans", empty, txns={"kafka:t:0": 10})
    with pytest.raises(ConcurrentWriteError, match="back from 10 to 5"):
        lake.write("spans", empty, txns={"kafka:t:0": 5})
    mine = lake.pin("spans")  # read the position 10 ...
    lake.write("spans", empty, txns={"kafka:t:0": 20})  # ... another writer moves it ...
    with pytest.raises(ConcurrentWriteError, match="Concurrent transaction"):  # ... so mine is refused
        lake.write("spans", empty, txns={"kafka:t:0": 20}, snapshot=mine, expect={"kafka:t:0": 10})
    assert lake.txn("spans", "kafka:t:0") == 20 and lake.version("spans") == 1
