"""Per-table retention in the nightly maintenance job, on real Delta tables."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from dagster import build_op_context

from pipelines.defs.automation import compact_and_vacuum
from pipelines.defs.resources import resources_from_settings
from pipelines.lake.forget import TIME_COLUMNS, honour, recorded
from pipelines.lake.retention import maintain
from schemas.config import load_settings
from schemas.config.lake import RETENTION_TABLES
from schemas.errors import ConfigError
from schemas.lake import Lake
from schemas.tables import TABLES

NOW = dt.datetime(2026, 11, 23, 3, 0, tzinfo=dt.UTC)
AGES = [40, 31, 29, 10, 0]  # days before NOW


def _span(i: int, age: int, tenant: str = "a", now: dt.datetime = NOW) -> dict:
    start = now - dt.timedelta(days=age, minutes=1)
    return {
        "tenant": tenant,
        "trace_id": f"t{i}",
        "span_id": f"s{i}",
        "name": "llm.call",
        "start_time": start,
        "rollout_id": f"r{i}",
        "day": start.date(),
    }


def _reward(i: int, age: int, now: dt.datetime = NOW) -> dict:
    when = now - dt.timedelta(days=age, minutes=1)
    return {
        "reward_id": f"e{i}",
        "source": "event",
        "tenant": "a",
        "name": "primary",
        "value": 1.0,
        "event_time": when,
        "day": when.date(),
    }


def _transition(i: int, age: int) -> dict:
    day = (NOW - dt.timedelta(days=age, minutes=1)).date()
    return {
        "transition_id": f"r{i}/None/0",
        "rollout_id": f"r{i}",
        "tenant": "a",
        "group_id": "g",
        "step": 0,
        "prompt_ids": [1],
        "response_ids": [2],
        "loss_mask": [1],
        "reward": 1.0,
        "return": 1.0,
        "advantage": 0.0,
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "created_at": NOW,  # computed recently: retention goes by the trajectory's day, not this
        "day": day,
    }


def make_lake(root: Path, now: dt.datetime = NOW) -> Lake:
    lake = Lake(str(root))
    for i, age in enumerate(AGES):  # one commit per row: a day's partition gets two small files to compact
        for row in (_span(i, age, "a", now), _span(i + 10, age, "b", now)):
            lake.write("spans", pa.Table.from_pylist([row], schema=TABLES["spans"]))
    rewards = [_reward(i, a, now) for i, a in enumerate(AGES)]
    lake.write("rewards", pa.Table.from_pylist(rewards, schema=TABLES["rewards"]))
    rows = [_transition(i, a) for i, a in enumerate(AGES)]
    lake.write("transitions", pa.Table.from_pylist(rows, schema=TABLES["transitions"]))
    return lake


def ages_left(lake: Lake, name: str, column: str, now: dt.datetime = NOW) -> list[int]:
    frame = lake.scan(name)
    assert frame is not None
    values = frame.select(column).collect()[column].to_list()
    if isinstance(values[0], dt.date) and not isinstance(values[0], dt.datetime):
        return sorted((now.date() - v).days for v in values)
    return sorted((now - v).days for v in values)


def test_maintenance_deletes_rows_past_retention_records_them_and_compacts(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    files_before = len(lake.table("spans").file_uris())  # type: ignore[union-attr]
    log: list[str] = []
    out = maintain(lake, {"spans": 30, "rewards": 7, "transitions": 30}, now=NOW, log=log.append)

    assert ages_left(lake, "spans", "start_time") == [0, 0, 10, 10, 29, 29]  # both tenants alike
    assert ages_left(lake, "rewards", "event_time") == [0]
    assert ages_left(lake, "transitions", "day") == [0, 10, 29]
    assert out.deleted == {"spans": 4, "rewards": 4, "transitions": 2}
    assert out.compacted["spans"] > 0 and len(lake.table("spans").file_uris()) < files_before  # type: ignore[union-attr]
    assert any("retention removed 4 rows" in line for line in log)

    rec = lake.scan("deletions").sort("tables").collect()  # type: ignore[union-attr]
    assert rec["kind"].to_list() == ["retention"] * 3
    assert rec["tenant"].to_list() == [None] * 3
    assert [t[0] for t in rec["tables"].to_list()] == ["rewards", "spans", "transitions"]
    assert rec["before"].to_list() == [NOW - dt.timedelta(days=d) for d in (7, 30, 30)]
    assert rec["rows_removed"].to_list() == [4, 4, 2]
    assert rec["requested_by"].to_list() == ["maintenance"] * 3
    assert rec["reason"].to_list() == ["retention: 7 days", "retention: 30 days", "retention: 30 days"]

    # the next night has nothing past retention: no new record, rows unchanged
    again = maintain(lake, {"spans": 30, "rewards": 7, "transitions": 30}, now=NOW)
    assert again.deleted == {} and lake.scan("deletions").collect().height == 3  # type: ignore[union-attr]
    assert len(ages_left(lake, "spans", "start_time")) == 6


def test_no_retention_keeps_every_row(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    out = maintain(lake, {}, now=NOW)
    assert out.deleted == {} and lake.table("deletions") is None
    assert len(ages_left(lake, "spans", "start_time")) == 2 * len(AGES)
    assert out.compacted["spans"] > 0


def test_the_maintenance_op_reads_retention_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = dt.datetime.now(dt.UTC)  # the op runs on the real clock
    lake = make_lake(tmp_path / "lake", now)
    monkeypatch.chdir(tmp_path)  # no agentlake.toml here
    monkeypatch.setenv("AGENTLAKE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AGENTLAKE_LAKE__RETENTION_DAYS", '{"rewards": 20}')
    monkeypatch.setenv("AGENTLAKE_LAKE", lake.root)
    compact_and_vacuum(build_op_context(resources={"lake": resources_from_settings()["lake"]}))
    assert ages_left(lake, "rewards", "event_time", now) == [0, 10]
    assert lake.scan("deletions").select(pl.col("kind")).collect()["kind"].to_list() == ["retention"]  # type: ignore[union-attr]


def test_retention_settings_are_checked() -> None:
    assert set(RETENTION_TABLES) == set(TIME_COLUMNS)
    with pytest.raises(ConfigError, match="no retention for table 'model_versions'"):
        load_settings(environ={}, discover=False, overrides={"lake": {"retention_days": {"model_versions": 3}}})
    with pytest.raises(ConfigError, match="at least 1 day"):
        load_settings(environ={}, discover=False, overrides={"lake": {"retention_days": {"spans": 0}}})
    s = load_settings(environ={"AGENTLAKE_LAKE__RETENTION_DAYS": '{"spans": 30}'}, discover=False)
    assert s.lake.retention_days == {"spans": 30}


def test_a_rebuild_applies_recorded_retention(tmp_path: Path) -> None:
    """What replay does after rebuilding from Kafka: the recorded retention deletes the same rows."""
    kept = make_lake(tmp_path / "kept")
    maintain(kept, {"spans": 30, "transitions": 30}, now=NOW)
    rebuilt = make_lake(tmp_path / "rebuilt")  # the same rows again, as a replay would write them
    assert honour(rebuilt, recorded(kept)) == 6
    for name, key in [("spans", "span_id"), ("transitions", "transition_id"), ("rewards", "reward_id")]:
        a = kept.scan(name).sort(key).collect()  # type: ignore[union-attr]
        b = rebuilt.scan(name).sort(key).collect()  # type: ignore[union-attr]
        assert a.equals(b), name
