"""The pending read at lake scale (issue 28): after a round, only the files written since it are read.

The proof is physical: the files the last round's snapshot held are removed from disk, and the count
and the next round still see exactly the new rows. A round whose lineage rows are missing does not
count as settled, so its rows are read (and pending) again.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

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
