"""N ingestion workers (pipelines.bronze.workers): who owns which partition, the setting, and the ways to run them.

The concurrency itself (two workers at once, exactly once, against the broker's acknowledged offsets)
is tests/lake/test_ingest_workers.py; here worker processes run for real through the Dagster asset and
the CLI on a real broker and Delta table.
"""

from __future__ import annotations

import polars as pl
import pytest
from deltalake import DeltaTable
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipelines.bronze.ingest import ingest
from pipelines.bronze.positions import app_id
from pipelines.bronze.workers import partition_sets, worker_partitions
from schemas.config import Settings, load_settings
from schemas.errors import ConfigError
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record


@given(parts=st.integers(1, 64), workers=st.integers(1, 64))
def test_workers_own_every_partition_once(parts: int, workers: int) -> None:
    topic = list(range(parts))
    if workers > parts:
        with pytest.raises(ConfigError, match=f"ingest.workers = {workers}, but topic 't' has {parts} partitions"):
            partition_sets("t", topic, workers)
        return
    sets = partition_sets("t", topic, workers)
    assert sorted(p for s in sets for p in s) == topic
    assert all(s and all(p % workers == i for p in s) for i, s in enumerate(sets))
    with pytest.raises(ValueError, match="a worker index is 0 to"):
        worker_partitions(topic, workers, workers)


def test_the_setting_is_validated() -> None:
    assert load_settings(environ={"AGENTLAKE_INGEST__WORKERS": "3"}).ingest.workers == 3
    with pytest.raises(ConfigError, match=r"ingest.workers: Input should be greater than or equal to 1"):
        load_settings(environ={"AGENTLAKE_INGEST__WORKERS": "0"})


def _spans(settings: Settings, n: int, prefix: str) -> int:
    """Produce ``n`` one-call rollouts to the spans topic; the number of spans."""
    records, count = [], 0
    for i in range(n):
        spans = make_spans(Rollout(f"{prefix}{i}", task_id="t", calls=[Call(prompt=[i], response=[2])]))
        count += len(spans)
        records.append(span_record(spans, key=f"{prefix}{i}"))
    produce(settings.kafka, settings.kafka.spans_topic, records)
    return count


def _positions(lake: Lake, settings: Settings) -> dict[int, int | None]:
    dt = DeltaTable(lake.uri("spans"))
    return {p: dt.transaction_version(app_id(settings.kafka.spans_topic, p)) for p in range(settings.kafka.partitions)}


@pytest.mark.kafka
def test_a_partition_the_topic_lacks_is_refused(settings: Settings) -> None:
    with pytest.raises(ValueError, match=r"cannot own \[9\]"):
        ingest(Lake.from_settings(settings), settings.kafka, "spans", partitions=[1, 9], workers=0)


@pytest.mark.kafka
def test_worker_processes_through_the_asset_and_the_cli(settings: Settings) -> None:
    """The `spans` asset with ``[ingest] workers = 2``, then the CLI's one-worker and N-worker runs."""
    from dagster import materialize

    from agentlake.cli import app
    from pipelines.defs.assets import spans
    from pipelines.defs.resources import resources_from_settings
    from tests.lake.workload import settings_env

    two = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"workers": 2})})
    lake = Lake.from_settings(two)
    n_spans = _spans(two, 60, "a")
    result = materialize([spans], resources=resources_from_settings(two))
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("spans")[0].metadata.items()}
    assert meta["workers"] == 2 and meta["records"] == 60 and meta["rows"] == n_spans
    assert pl.read_delta(lake.uri("spans")).height == n_spans

    # worker 0 of 2 alone (as on its own machine): only partitions 0 and 2 move
    before = _positions(lake, two)
    n_spans += _spans(two, 40, "b")
    env = {**settings_env(two), "AGENTLAKE_INGEST__WORKERS": "2"}
    out = CliRunner().invoke(app, ["lake", "ingest", "--worker", "0"], env=env)
    assert out.exit_code == 0, out.output
    moved = {p for p, v in _positions(lake, two).items() if v != before[p]}
    assert moved and moved <= {0, 2}, moved
    out = CliRunner().invoke(app, ["lake", "ingest", "--worker", "2"], env=env)
    assert out.exit_code != 0 and "--worker must be below --workers (2)" in out.output
    out = CliRunner().invoke(app, ["lake", "ingest", "--workers", "5"], env=env)
    assert out.exit_code != 0 and "a worker would own none" in " ".join(out.output.split())
    # both workers as processes catch up the rest, each span once
    out = CliRunner().invoke(app, ["lake", "ingest"], env=env)
    assert out.exit_code == 0, out.output
    df = pl.read_delta(lake.uri("spans"))
    assert df.height == n_spans == df.select(pl.struct("kafka_partition", "kafka_offset", "span_id").n_unique()).item()
    per = df.group_by("kafka_partition").agg(pl.col("kafka_offset").max())
    assert _positions(lake, two) == {p: hi for p, hi in per.iter_rows()}
