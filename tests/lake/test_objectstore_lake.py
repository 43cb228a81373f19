"""The whole lake on a real S3 object store (SeaweedFS): pipeline, DuckDB, Polars, replay, compaction, vacuum.

The same code paths the default `agentlake up` lake takes (``s3://agentlake-lake/...`` with the store's
storage options); each test gets a fresh root in the session's store.
"""

from __future__ import annotations

import datetime
import json

import polars as pl
import pyarrow as pa
import pytest
from dagster import materialize
from pyarrow.fs import FileSelector
from typer.testing import CliRunner

from pipelines.defs.assets import all_assets
from pipelines.defs.checks import all_checks
from pipelines.defs.resources import resources_from_settings
from pipelines.lake.query import run_query, secret_params
from pipelines.lake.replay import replay
from schemas.config import Settings
from schemas.lake import Lake
from schemas.storage import filesystem
from schemas.tables import SPANS
from tests.objectstore import ObjectStore
from tests.pipelines.otel import Call, Rollout, make_spans, produce, reward_record, span_record


@pytest.fixture()
def s3_settings(settings: Settings, object_store: ObjectStore) -> Settings:
    settings.lake.root = object_store.lake_root()
    settings.lake.storage_options = object_store.storage_options
    return settings


def _cli(settings: Settings, *args: str) -> str:
    from agentlake.cli import app

    env = {
        "AGENTLAKE_STATE_DIR": str(settings.state.dir),
        "AGENTLAKE_LAKE": settings.lake.root,
        "AGENTLAKE_LAKE__STORAGE_OPTIONS": json.dumps(dict(settings.lake.storage_options)),
    }
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def _frame(lake: Lake, name: str) -> pl.DataFrame:
    scan = lake.scan(name)
    assert scan is not None, name
    return scan.collect()


def _rollouts(n: int) -> list[Rollout]:
    return [
        Rollout(
            f"r{i}",
            task_id="sum",
            calls=[
                Call(prompt=[1, 2, 3], response=[10 + i, 11], logprobs=[-0.1, -0.2]),
                Call(prompt=[1, 2, 3, 10 + i, 11, 7], response=[12], logprobs=[-0.3], reward_after=None),
            ],
            final_reward=float(i % 2),
        )
        for i in range(n)
    ]


@pytest.mark.kafka
def test_pipeline_query_scan_and_replay_on_s3(s3_settings: Settings, object_store: ObjectStore) -> None:
    k, lake = s3_settings.kafka, Lake.from_settings(s3_settings)
    assert lake.root.startswith("s3://")
    rollouts = _rollouts(6)
    produce(k, k.spans_topic, [span_record(make_spans(r), key=r.rollout_id) for r in rollouts])
    produce(k, k.rewards_topic, [reward_record({"rollout_id": "r0", "value": 0.25, "event_id": "late"})])
    result = materialize([*all_assets, *all_checks], resources=resources_from_settings(s3_settings))
    assert result.success
    assert all(ev.passed for ev in result.get_asset_check_evaluations())

    n_spans = sum(len(make_spans(r)) for r in rollouts)
    assert _frame(lake, "spans").height == n_spans
    traj = _frame(lake, "trajectories").sort("rollout_id")
    assert traj["rollout_id"].to_list() == [f"r{i}" for i in range(6)]
    assert traj["final_reward"].to_list() == [0.25, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert _frame(lake, "transitions").height == 12

    # DuckDB (httpfs + delta, credentials from the storage options) reads what Polars reads
    for name, key in (("spans", ["trace_id", "span_id"]), ("transitions", ["transition_id"])):
        duck = pl.from_arrow(run_query(lake, f"SELECT * FROM {name}"))
        assert isinstance(duck, pl.DataFrame)
        polars = _frame(lake, name)
        assert duck.height == polars.height
        assert duck.select(key).sort(key).equals(polars.select(key).sort(key)), name
    out = _cli(s3_settings, "query", "SELECT count(*) AS n FROM transitions", "-f", "csv")
    assert out.splitlines() == ["n", "12"]
    assert "s3://" in _cli(s3_settings, "tables")

    # replay from Kafka into a fresh root on the same store gives the same rows
    fresh = Lake(object_store.lake_root(), object_store.storage_options)
    replay(s3_settings, fresh)
    for name, key, drop in [
        ("spans", ["trace_id", "span_id"], []),
        ("trajectories", ["rollout_id"], ["updated_at"]),
        ("transitions", ["transition_id"], ["created_at"]),
    ]:
        a = _frame(lake, name).drop(drop).sort(key)
        b = _frame(fresh, name).drop(drop).sort(key)
        assert a.equals(b), name


def _span_rows(commit: int, n: int) -> pa.Table:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return pa.Table.from_pylist(
        [
            {
                "tenant": "default",
                "trace_id": f"t{commit}",
                "span_id": f"{commit}-{i}",
                "name": "step",
                "start_time": now,
                "rollout_id": f"r{commit}",
                "day": now.date(),
                "kafka_topic": "t",
                "kafka_partition": 0,
                "kafka_offset": commit,
            }
            for i in range(n)
        ],
        schema=SPANS,
    )


def test_compact_and_vacuum_on_s3(s3_settings: Settings) -> None:
    lake = Lake.from_settings(s3_settings)
    for i in range(8):  # eight small commits, eight small files
        lake.write("spans", _span_rows(i, 5), txns={"kafka:t:0": i})
    table = lake.table("spans")
    assert table is not None
    before = pl.from_arrow(table.to_pyarrow_table())
    files_before = len(table.file_uris())

    assert "spans:" in _cli(s3_settings, "lake", "compact", "--table", "spans")
    table = lake.table("spans")
    assert table is not None and len(table.file_uris()) == 1 < files_before
    assert lake.txn("spans", "kafka:t:0") == 7, "compaction keeps the source positions"
    after = _frame(lake, "spans")
    assert after.sort("span_id").equals(before.sort("span_id"))  # type: ignore[union-attr]

    dry = _cli(s3_settings, "lake", "vacuum", "--table", "spans", "--retention-hours", "0", "--dry-run")
    assert f"would delete {files_before} files" in dry
    out = _cli(s3_settings, "lake", "vacuum", "--table", "spans", "--retention-hours", "0")
    assert f"deleted {files_before} files" in out
    fs, base = filesystem(lake.uri("spans"), lake.storage_options)
    stored = [f for f in fs.get_file_info(FileSelector(base, recursive=True)) if f.path.endswith(".parquet")]
    assert len(stored) == 1, "the bucket keeps only the compacted file"
    assert _frame(lake, "spans").sort("span_id").equals(before.sort("span_id"))  # type: ignore[union-attr]
    assert run_query(lake, "SELECT count(*) AS n FROM spans").to_pylist() == [{"n": before.height}]


def test_storage_options_map_to_duckdb_secrets() -> None:
    s3 = secret_params(
        "s3://b/lake",
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "aws_access_key_id": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_REGION": "eu-west-1",
        },
    )
    assert s3 == (
        "S3",
        {
            "KEY_ID": "k",
            "SECRET": "s",
            "REGION": "eu-west-1",
            "ENDPOINT": "127.0.0.1:9000",
            "USE_SSL": "false",
            "URL_STYLE": "path",
        },
    )
    assert secret_params("gs://b/lake", {"GOOGLE_HMAC_KEY_ID": "k", "GOOGLE_HMAC_SECRET": "s"}) == (
        "GCS",
        {"KEY_ID": "k", "SECRET": "s"},
    )
    kind, params = secret_params(
        "az://c/lake", {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "x"}
    )  # type: ignore[misc]
    assert kind == "AZURE" and "AccountName=acct;AccountKey=x" in params["CONNECTION_STRING"]
    assert secret_params("/tmp/lake", {"AWS_REGION": "x"}) is None
    assert secret_params("s3://b/lake", {}) is None  # DuckDB's default credential chain
