"""The pending read at lake scale (issue 28): after a round, only the files written since it are read.

The proof is physical: the files the last round's snapshot held are removed from disk, and the count
and the next round still see exactly the new rows. A round whose lineage rows are missing does not
count as settled, so its rows are read (and pending) again.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.lake import Lake
from tests.trainer.helpers import write_transitions
from tests.trainer.test_consumption import _cfg, _rows
from tests.trainer.test_consumption import tokens as tokens  # noqa: F401 - the module fixture
from trainer.round import count_pending, train_once


def _remove_files(table: str, version: int) -> int:
    """Delete from disk every data file of ``table``'s snapshot at ``version``: a read of one fails."""
    files = DeltaTable(table, version=version).file_uris()
    for uri in files:
        os.remove(uri.removeprefix("file://"))
    return len(files)


@pytest.mark.slow  # two training rounds: ~5 s
def test_after_a_round_only_files_written_since_are_read(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    cfg = _cfg(lake, tiny_model_dir, lake.parent / "models")
    write_transitions(lake, _rows(tokens, range(0, 6)))
    write_transitions(lake, _rows(tokens, range(6, 10)))
    first = train_once(cfg=cfg)
    assert first.n_transitions == 10 and first.version_end is not None
    write_transitions(lake, _rows(tokens, range(10, 13)))
    assert _remove_files(f"{lake}/transitions", first.version_end) == 2
    assert count_pending(cfg)[0] == 3
    second = train_once(cfg=cfg)
    assert second.n_transitions == 3


@pytest.mark.slow  # one training round: ~3 s
def test_a_round_without_lineage_rows_is_not_settled(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    cfg = _cfg(lake, tiny_model_dir, lake.parent / "models")
    write_transitions(lake, _rows(tokens, range(0, 5)))
    first = train_once(cfg=cfg)
    assert first.n_transitions == 5
    write_transitions(lake, _rows(tokens, range(5, 7)))
    assert count_pending(cfg)[0] == 2
    # the lineage write failed after the registry row (trainer.round): its rows count as not trained on
    Lake(str(lake)).table("training_lineage").delete(f"model_version = '{first.version}'")  # type: ignore[union-attr]
    assert count_pending(cfg)[0] == 7


_OPS = st.lists(
    st.tuples(st.sampled_from(["append", "rewrite", "compact", "delete"]), st.integers(0, 3), st.integers(1, 4)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=_OPS, after=_OPS)
def test_skipping_settled_files_reads_what_reading_every_file_reads(
    tmp_path_factory: pytest.TempPathFactory, before: list[tuple[str, int, int]], after: list[tuple[str, int, int]]
) -> None:
    """Whatever appends, group rewrites, compactions and deletes come after the settled version, the
    pending ids read from the files written since equal those read from every file."""
    from schemas.lake import in_list
    from schemas.tables import TRANSITIONS
    from tests.trainer.helpers import transition
    from trainer.data import read_transitions

    root = tmp_path_factory.mktemp("lake")
    lake = Lake(str(root))
    next_id = [0]

    def rows(group: int, n: int, *, reuse: bool = False) -> list[dict[str, object]]:
        first = group * 3 if reuse else next_id[0] + 100  # a rewrite keeps ids it may already have stored
        next_id[0] += 0 if reuse else n
        return [transition(first + i, [1, 2, 3], [4, 5], advantage=1.0, group=f"g{group}") for i in range(n)]

    def apply(op: str, group: int, n: int) -> None:
        if op == "append" or lake.table("transitions") is None:
            write_transitions(root, rows(group, n))
        elif op == "rewrite":  # what the transitions step does to a recomputed group
            table = pa.Table.from_pylist(rows(group, n, reuse=True), schema=TRANSITIONS)
            lake.write("transitions", table, mode="overwrite", predicate=in_list("group_id", [f"g{group}"]))
        elif op == "compact":
            lake.compact("transitions")
        else:
            lake.table("transitions").delete(f"group_id = 'g{group}'")  # type: ignore[union-attr]

    for op in before:
        apply(op[0], op[1], op[2])
    settled = lake.version("transitions")
    assert settled is not None
    consumed = read_transitions(lake, ids_only=True).rows["transition_id"]
    for op in after:
        apply(op[0], op[1], op[2])
    every = read_transitions(lake, exclude_ids=consumed, ids_only=True).rows
    since = read_transitions(lake, exclude_ids=consumed, ids_only=True, settled_version=settled).rows
    assert since.equals(every)
