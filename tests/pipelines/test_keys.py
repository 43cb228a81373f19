"""`keys.predicate` as delta-rs evaluates it: exactly the rows of the (tenant, id) pairs, short lists and long
ones (those skip the file statistics, `keys.PRUNED_IN_LIST`), and a replacement by it still refuses a
concurrent writer that added the same rows. `schemas.lake.read_matching`, the two-phase read by key,
against a plain filter."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import keys
from schemas.lake import read_matching

TENANTS = ["default", "acme", "o'brien"]
IDS = st.text(alphabet=st.sampled_from("ab'%_-\\é 0"), min_size=1, max_size=6)


def _table(rows: list[tuple[str, str, dt.date]]) -> pa.Table:
    return pa.table(
        {
            "tenant": [r[0] for r in rows],
            "rollout_id": [r[1] for r in rows],
            "day": pa.array([r[2] for r in rows], pa.date32()),
        }
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stored=st.lists(st.tuples(st.sampled_from(TENANTS), IDS, st.integers(0, 3)), min_size=1, max_size=60),
    picked=st.integers(0, 60),
    extra=st.lists(st.tuples(st.sampled_from(TENANTS), IDS), max_size=40),
    files=st.integers(1, 4),
)
def test_a_delete_by_the_predicate_removes_exactly_those_pairs(
    tmp_path: Path,
    stored: list[tuple[str, str, int]],
    picked: int,
    extra: list[tuple[str, str]],
    files: int,
) -> None:
    path = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
    day0 = dt.date(2026, 11, 1)
    rows = [(t, r, day0 + dt.timedelta(days=d)) for t, r, d in stored]
    for k in range(files):  # several commits: several files per day
        write_deltalake(str(path), _table(rows[k::files]), mode="append", partition_by=["day"])
    # some stored pairs and some the table does not hold, past PRUNED_IN_LIST per tenant now and then
    pairs = {(t, r) for t, r, _ in stored[:picked]} | set(extra)
    DeltaTable(str(path)).delete(keys.predicate(pairs, "rollout_id"))
    left = DeltaTable(str(path)).to_pyarrow_table()
    got = sorted(zip(left["tenant"].to_pylist(), left["rollout_id"].to_pylist(), left["day"].to_pylist(), strict=True))
    assert got == sorted(r for r in rows if (r[0], r[1]) not in pairs)


def test_a_long_list_is_matched_without_file_statistics() -> None:
    short = keys.predicate([("default", f"r{i}") for i in range(keys.PRUNED_IN_LIST)], "rollout_id")
    long = keys.predicate([("default", f"r{i}") for i in range(keys.PRUNED_IN_LIST + 1)], "rollout_id")
    assert "rollout_id IN (" in short and "concat(" not in short
    assert "concat(rollout_id, '') IN (" in long


@pytest.mark.parametrize("n", [3, 500])
def test_two_replacements_of_the_same_new_rollouts_from_one_snapshot_land_once(tmp_path: Path, n: int) -> None:
    """Two runs of a step at once: both read the same snapshot and replace the same new rollouts; the second
    commit is refused (nothing lands twice), with a short list and with a long one."""
    path = str(tmp_path / "t")
    write_deltalake(path, _table([("default", "old", dt.date(2026, 11, 1))]), partition_by=["day"])
    new = _table([("default", f"r{i}", dt.date(2026, 11, 2)) for i in range(n)])
    pred = f"day >= '2026-11-02' AND ({keys.predicate([('default', f'r{i}') for i in range(n)], 'rollout_id')})"
    first, second = DeltaTable(path), DeltaTable(path)
    write_deltalake(first, new, mode="overwrite", predicate=pred)
    with pytest.raises(CommitFailedError):
        write_deltalake(second, new, mode="overwrite", predicate=pred)
    assert DeltaTable(path).to_pyarrow_table().num_rows == n + 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    commits=st.lists(
        st.lists(st.tuples(st.sampled_from(TENANTS), IDS, st.integers(0, 2)), min_size=1, max_size=15),
        min_size=1,
        max_size=5,
    ),
    wanted=st.lists(st.tuples(st.sampled_from(TENANTS), IDS), max_size=10),
)
def test_read_matching_reads_what_a_filter_reads(
    tmp_path: Path, commits: list[list[tuple[str, str, int]]], wanted: list[tuple[str, str]]
) -> None:
    """Rows written in several commits, each with its own offsets (the locator), read back by key:
    the two-phase read returns exactly what one filter does."""
    path = str(tmp_path / f"t{len(list(tmp_path.iterdir()))}")
    offset = 0
    for n, rows in enumerate(commits):
        data = _table([(t, r, dt.date(2026, 11, 1) + dt.timedelta(days=d)) for t, r, d in rows]).append_column(
            "kafka_partition", pa.array([n % 2] * len(rows), pa.int32())
        )
        data = data.append_column("kafka_offset", pa.array(range(offset, offset + len(rows)), pa.int64()))
        offset += len(rows)
        write_deltalake(path, data, mode="append", partition_by=["day"])
    scan = pl.scan_delta(DeltaTable(path))
    where = keys.among(wanted, "rollout_id")
    got = read_matching(scan, where, ["kafka_partition", "kafka_offset"])
    want = scan.filter(where).collect()
    assert got.schema == want.schema
    assert got.sort("kafka_offset").equals(want.sort("kafka_offset"))
    assert keys.keep(got, wanted, "rollout_id").height == keys.keep(want, wanted, "rollout_id").height
