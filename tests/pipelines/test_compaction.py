"""The hourly compaction of the recent day partitions, on real Delta tables and a real Dagster instance."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from dagster import build_schedule_context, instance_for_test
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from typer.testing import CliRunner

from pipelines.defs.automation import compact_recent_job, compaction_schedule
from pipelines.defs.resources import LakeResource
from pipelines.lake.compaction import DAY_TABLES, compact_recent, recent_days
from schemas.config import load_settings
from schemas.errors import ConfigError, LakeError
from schemas.lake import Lake
from schemas.tables import TABLES

NOW = dt.datetime(2026, 11, 23, 0, 40, tzinfo=dt.UTC)  # 40 minutes into a day: yesterday still gets late spans
COMMITS_PER_DAY = 4


def _span(i: int, day_age: int, now: dt.datetime) -> dict:
    start = now.replace(hour=0, minute=40) - dt.timedelta(days=day_age, minutes=30 - i)
    return {"tenant": "a", "trace_id": f"t{day_age}-{i}", "span_id": f"s{day_age}-{i}", "name": "llm.call",
            "start_time": start, "rollout_id": f"r{day_age}-{i}", "day": start.date()}  # fmt: skip


def make_lake(root: Path, now: dt.datetime = NOW) -> Lake:
    """Spans of three days, four small commits each, every commit carrying a source position."""
    lake = Lake(str(root))
    for i in range(COMMITS_PER_DAY):
        for age in (0, 1, 2):
            row = pa.Table.from_pylist([_span(i, age, now)], schema=TABLES["spans"])
            lake.write("spans", row, txns={"kafka:agentlake.spans.v1:0": 3 * i + age})
    return lake


def files_by_day(lake: Lake, name: str = "spans") -> dict[str, set[str]]:
    table = lake.table(name)
    assert table is not None
    out: dict[str, set[str]] = {}
    for uri in table.file_uris():
        day = next(part.split("=", 1)[1] for part in uri.split("/") if part.startswith("day="))
        out.setdefault(day, set()).add(uri)
    return out


def rows(lake: Lake, name: str = "spans") -> pl.DataFrame:
    frame = lake.scan(name)
    assert frame is not None
    return frame.collect().sort("span_id")


def test_recent_days_are_the_newest_calendar_days_in_utc() -> None:
    assert recent_days(NOW, 2) == [dt.date(2026, 11, 23), dt.date(2026, 11, 22)]
    late_evening_in_new_york = dt.datetime(2026, 11, 22, 20, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    assert recent_days(late_evening_in_new_york, 1) == [dt.date(2026, 11, 23)]
    with pytest.raises(ValueError, match="at least 1 day"):
        recent_days(NOW, 0)


def test_only_the_recent_days_are_rewritten_and_nothing_else_changes(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    before, files = rows(lake), files_by_day(lake)
    assert [len(files[d]) for d in sorted(files)] == [COMMITS_PER_DAY] * 3
    position = lake.txn("spans", "kafka:agentlake.spans.v1:0")

    log: list[str] = []
    done = compact_recent(lake, days=2, now=NOW, log=log.append)

    after = files_by_day(lake)
    assert len(after["2026-11-23"]) == 1 and len(after["2026-11-22"]) == 1
    assert after["2026-11-21"] == files["2026-11-21"]  # the older day is not read or rewritten
    assert done.files_removed["spans"] == 2 * COMMITS_PER_DAY and done.files_added["spans"] == 2
    assert "rewards" not in done.files_removed  # a table that does not exist yet is skipped
    assert rows(lake).equals(before)
    assert lake.txn("spans", "kafka:agentlake.spans.v1:0") == position  # a compaction moves no position
    assert any("spans: 8 files -> 2 in days 2026-11-22, 2026-11-23" in line for line in log)
    # the next hour finds one file per recent day: nothing to do
    again = compact_recent(lake, days=2, now=NOW)
    assert again.files_removed["spans"] == 0 and files_by_day(lake) == after


def test_a_table_not_partitioned_by_day_is_refused(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    lake.write("deletions", pa.Table.from_pylist([], schema=TABLES["deletions"]))
    with pytest.raises(LakeError, match="not partitioned by day"):
        lake.compact("deletions", days=[NOW.date()])
    assert set(DAY_TABLES) == {"spans", "rewards", "trajectories", "transitions"}


def test_a_commit_refused_by_a_concurrent_rewrite_is_compacted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline run deletes and rewrites files between the compaction's read and its commit.

    The concurrent commit is real (a delete on another handle of the same table, as a gold step's
    replacement does); only its timing is arranged: `Lake.table` hands the compaction a snapshot loaded
    before that commit, which is what a compaction racing a run sees.
    """
    lake = make_lake(tmp_path / "lake")
    real_table = Lake.table
    stale = real_table(lake, "spans")
    assert stale is not None
    DeltaTable(lake.uri("spans")).delete("span_id = 's0-1'")  # the concurrent run, committed first
    monkeypatch.setattr(Lake, "table", lambda self, name: stale if name == "spans" else real_table(self, name))

    refused = compact_recent(lake, days=2, now=NOW, attempts=1)
    assert "spans" in refused.refused and "concurrent transaction" in refused.refused["spans"]
    with pytest.raises(CommitFailedError):
        lake.compact("spans", days=[NOW.date()], attempts=1)

    done = compact_recent(lake, days=2, now=NOW, attempts=2)  # the retry reads the newer snapshot
    monkeypatch.undo()
    assert done.refused == {} and len(files_by_day(lake)["2026-11-23"]) == 1
    left = rows(lake)["span_id"].to_list()
    assert "s0-1" not in left and len(left) == 3 * COMMITS_PER_DAY - 1  # the delete holds, nothing else went


def test_the_job_runs_in_dagster_on_its_schedule(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake")
    result = compact_recent_job.execute_in_process(resources={"lake": LakeResource(root=lake.root, compact_days=31)})
    assert result.success
    assert all(len(f) == 1 for f in files_by_day(lake).values())  # 31 days back reaches all three
    materialized = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert materialized and materialized[0].event_specific_data.metadata["files_removed"].value == 3 * COMMITS_PER_DAY

    schedule = compaction_schedule()
    assert schedule.cron_schedule == load_settings(environ={}, discover=False).lake.compact_cron == "30 * * * *"
    with instance_for_test() as instance:
        tick = schedule.evaluate_tick(build_schedule_context(instance=instance))
        assert len(tick.run_requests or []) == 1


def test_compaction_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="lake.compact_cron.*not a cron expression"):
        load_settings(environ={"AGENTLAKE_LAKE__COMPACT_CRON": "hourly"}, discover=False)
    with pytest.raises(ConfigError, match="compact_days"):
        load_settings(environ={"AGENTLAKE_LAKE__COMPACT_DAYS": "0"}, discover=False)
    s = load_settings(environ={"AGENTLAKE_LAKE__COMPACT_CRON": "*/15 * * * *"}, discover=False)
    assert s.lake.compact_cron == "*/15 * * * *" and compaction_schedule().cron_schedule == "30 * * * *"


def test_the_cli_compacts_the_recent_days(tmp_path: Path) -> None:
    from agentlake.cli import app

    lake = make_lake(tmp_path / "lake", dt.datetime.now(dt.UTC))  # the command runs on the real clock
    config = tmp_path / "agentlake.toml"
    config.write_text(f'[lake]\nroot = "{lake.root}"\n[state]\ndir = "{tmp_path / "state"}"\n')
    out = CliRunner().invoke(app, ["lake", "compact", "--recent-days", "1", "--config", str(config)])
    assert out.exit_code == 0, out.output
    assert f"spans: {COMMITS_PER_DAY} files -> 1" in out.output
    assert [len(f) for _, f in sorted(files_by_day(lake).items())] == [COMMITS_PER_DAY, COMMITS_PER_DAY, 1]
    wrong = CliRunner().invoke(
        app, ["lake", "compact", "--recent-days", "1", "--table", "deletions", "--config", str(config)]
    )
    assert wrong.exit_code == 2 and "partitioned by day" in wrong.output
