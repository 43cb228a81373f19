"""Clustering day partitions by rollout id (``Lake.cluster``, the nightly maintenance, the CLI), on real Delta
tables read back through Parquet's own footers: rows and positions stay, the chosen days are sorted into small row
groups, other days are untouched, and a forget's rewrite keeps the small row groups (not the order: the nightly
clustering or ``agentlake lake cluster --day`` sorts such a day again)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipelines.defs.automation import maintenance_job
from pipelines.defs.resources import LakeResource
from pipelines.lake.compaction import finished_days
from pipelines.lake.forget import forget
from pipelines.lake.retention import maintain
from schemas.errors import LakeError
from schemas.lake import CLUSTER_ROW_GROUP_ROWS, Lake
from schemas.tables import TABLES
from tests.pipelines.test_compaction import files_by_day, rows

DAYS = (dt.date(2026, 11, 20), dt.date(2026, 11, 21))
PER_COMMIT = 300


def _lake(root: Path, per_commit: int = PER_COMMIT) -> Lake:
    """Spans of two days, three commits a day, rollout ids random as uuids are (no order by day or commit)."""
    rng = random.Random(7)
    lake = Lake(str(root))
    for commit in range(3):
        for day in DAYS:
            start = dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC)
            batch = [
                {"tenant": "default", "trace_id": f"{rng.getrandbits(128):032x}", "span_id": f"{day}-{commit}-{i}",
                 "name": "llm.call", "start_time": start, "rollout_id": f"{rng.getrandbits(64):016x}", "day": day}
                for i in range(per_commit)
            ]  # fmt: skip
            lake.write("spans", pa.Table.from_pylist(batch, schema=TABLES["spans"]), txns={"kafka:s:0": commit})
    return lake


def row_groups(path: str) -> list[tuple[str, str, int]]:
    """(min, max, rows) of ``rollout_id`` in each row group of one Parquet file, from its footer."""
    meta = pq.ParquetFile(path.removeprefix("file://")).metadata
    col = meta.schema.to_arrow_schema().get_field_index("rollout_id")
    out = []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        out.append((stats.min, stats.max, meta.row_group(i).num_rows))
    return out


def test_a_clustered_day_is_sorted_into_small_row_groups_and_nothing_else_changes(tmp_path: Path) -> None:
    lake = _lake(tmp_path / "lake")
    before, files = rows(lake), files_by_day(lake)
    position = lake.txn("spans", "kafka:s:0")

    lake.cluster("spans", days=[DAYS[1]], row_group_rows=128)

    after = files_by_day(lake)
    assert after[str(DAYS[0])] == files[str(DAYS[0])]  # the other day is neither read nor rewritten
    (clustered,) = after[str(DAYS[1])]
    groups = row_groups(clustered)
    assert [n for *_, n in groups] == [128] * 7 + [3 * PER_COMMIT - 7 * 128]
    # sorted: each group's ids lie above the last group's, so a reader of one id opens one group
    assert all(prev[1] < nxt[0] for prev, nxt in zip(groups, groups[1:], strict=False))
    assert rows(lake).equals(before)
    assert lake.txn("spans", "kafka:s:0") == position  # a data-preserving rewrite moves no position


def test_a_forget_keeps_the_small_row_groups_of_the_file_it_rewrites(tmp_path: Path) -> None:
    per_commit = CLUSTER_ROW_GROUP_ROWS // 3 + 100  # a clustered day of two row groups
    lake = _lake(tmp_path / "lake", per_commit)
    lake.cluster("spans")
    rollout = rows(lake).filter(day=DAYS[0])["rollout_id"][5]

    done = forget(lake, "default", rollout=rollout)

    assert done.tables["spans"].rows == 1
    (rewritten,) = [row_groups(f) for f in files_by_day(lake)[str(DAYS[0])]]
    assert [n for *_, n in rewritten] == [CLUSTER_ROW_GROUP_ROWS, 3 * per_commit - CLUSTER_ROW_GROUP_ROWS - 1]


def test_only_day_partitioned_tables_cluster_by_day(tmp_path: Path) -> None:
    lake = _lake(tmp_path / "lake")
    lake.write("deletions", pa.Table.from_pylist([], schema=TABLES["deletions"]))
    with pytest.raises(LakeError, match="not partitioned by day"):
        lake.cluster("deletions", days=[DAYS[0]])
    assert lake.cluster("rewards") is None  # not created yet


def test_the_days_clustered_tonight_are_the_one_leaving_the_window_and_older_ones_with_several_files() -> None:
    now = dt.datetime(2026, 11, 23, 3, 0, tzinfo=dt.UTC)  # the nightly run; the hourly window is the 22nd and 23rd
    files = {dt.date(2026, 11, d): n for d, n in {23: 5, 22: 3, 21: 4, 20: 1, 19: 2, 18: 1}.items()}
    assert finished_days(files, window=2, now=now) == [dt.date(2026, 11, 19), dt.date(2026, 11, 21)]
    assert finished_days(files, window=4, now=now) == [dt.date(2026, 11, 19)]


def test_the_nightly_maintenance_clusters_finished_days_in_dagster(tmp_path: Path) -> None:
    lake = _lake(tmp_path / "lake")  # days 2026-11-20 and 21, three files each
    before = rows(lake)
    now = dt.datetime(2026, 11, 23, 3, 0, tzinfo=dt.UTC)  # the 21st just left a two-day window; the 20th has 3 files

    done = maintain(lake, {}, now=now, window=2)

    assert done.clustered == {"spans": list(DAYS)}
    for day in DAYS:
        (only,) = files_by_day(lake)[str(day)]
        ids = pq.read_table(only.removeprefix("file://"), columns=["rollout_id"])["rollout_id"].to_pylist()
        assert ids == sorted(ids)
    assert rows(lake).equals(before)
    assert maintain(lake, {}, now=now + dt.timedelta(days=1), window=2).clustered == {}  # one file a day: done

    result = maintenance_job.execute_in_process(resources={"lake": LakeResource(root=lake.root)})
    assert result.success
    (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert output.event_specific_data.metadata["days_clustered"].value == 0


def test_the_cli_clusters_named_days_and_refuses_bad_ones(tmp_path: Path) -> None:
    from agentlake.cli import app

    lake = _lake(tmp_path / "lake")
    config = tmp_path / "agentlake.toml"
    config.write_text(f'[lake]\nroot = "{lake.root}"\n[state]\ndir = "{tmp_path / "state"}"\n')
    run = CliRunner().invoke
    out = run(app, ["lake", "cluster", "--day", str(DAYS[0]), "--table", "spans", "--config", str(config)])
    assert out.exit_code == 0 and "spans: 1 days clustered" in out.output, out.output
    assert [len(files_by_day(lake)[str(d)]) for d in DAYS] == [1, 3]
    out = run(app, ["lake", "cluster", "--all-days", "--config", str(config)])
    assert out.exit_code == 0 and "spans: 2 days clustered" in out.output, out.output
    bad = run(app, ["lake", "cluster", "--day", "yesterday", "--config", str(config)])
    assert bad.exit_code == 2 and "YYYY-MM-DD" in bad.output
    wrong = run(app, ["lake", "cluster", "--table", "deletions", "--config", str(config)])
    assert wrong.exit_code == 2 and "partitioned by day" in wrong.output


def test_only_small_files_make_a_day_need_clustering_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clustered busy day is several full files: counting every file would cluster it again every night."""
    from pipelines.lake import compaction

    lake = _lake(tmp_path / "lake")  # three files a day, each a few KB
    assert compaction.small_files_per_day(lake, "spans") == {DAYS[0]: 3, DAYS[1]: 3}
    sizes = lake.table("spans").get_add_actions(flatten=True).column("size_bytes").to_pylist()  # type: ignore[union-attr]
    monkeypatch.setattr(compaction, "SMALL_FILE_BYTES", min(sizes))  # every file now counts as a full one
    assert compaction.small_files_per_day(lake, "spans") == {DAYS[0]: 0, DAYS[1]: 0}
    now = dt.datetime(2026, 11, 24, 3, 0, tzinfo=dt.UTC)  # both days long out of the window
    assert compaction.cluster_finished(lake, now=now).days == {}
