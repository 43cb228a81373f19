"""Exact consumption: each transition is trained on once, whatever compaction, vacuum, group rewrites,
duplicate writes or the spelling of the lake do to the table; and which version trained on what is SQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from schemas.config import load_settings
from schemas.lake import Lake
from schemas.tables import TRANSITIONS
from tests.trainer.helpers import build_tokenizer, transition, write_transitions
from trainer.config import TrainConfig
from trainer.registry import Registry
from trainer.round import train_once


@pytest.fixture(scope="module")
def tokens() -> dict[str, list[int]]:
    tok = build_tokenizer()
    return {w: tok(w)["input_ids"] for w in ("what is two plus three", "good yes", "bad")}


def _rows(
    tokens: dict[str, list[int]], ids: range, *, group: str = "g0", advantage: float = 1.0
) -> list[dict[str, Any]]:
    prompt = tokens["what is two plus three"]
    return [
        transition(i, prompt, tokens["good yes"] if i % 2 else tokens["bad"], advantage=advantage, group=group)
        for i in ids
    ]


def _cfg(root: str | Path, model: Path, checkpoints: Path) -> TrainConfig:
    return TrainConfig(
        lake_root=str(root),
        base_model=str(model),
        checkpoint_dir=str(checkpoints),
        min_new_transitions=1,
        lora_rank=4,
        batch_size=8,
        max_steps=1,
        progress=False,
    )


def _compact_and_vacuum(lake: Path) -> None:
    """What the nightly maintenance job does, with no retention so the old files really go."""
    table = DeltaTable(f"{lake}/transitions")
    assert table.optimize.compact()["numFilesRemoved"] > 1
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)


def _rewrite_groups(lake: Path, rows: list[dict[str, Any]], groups: list[str]) -> int:
    """What `pipelines.gold.transitions_step.update_transitions` does to a recomputed group: overwrite it."""
    from schemas.lake import in_list

    table = pa.Table.from_pylist(rows, schema=TRANSITIONS)
    return Lake(str(lake)).write("transitions", table, mode="overwrite", predicate=in_list("group_id", groups))


def _sensor_count(lake: Path) -> int:
    """The Dagster training sensor's count of new transitions."""
    from pipelines.defs.automation import new_transitions

    return new_transitions(load_settings(environ={}, overrides={"lake": {"root": str(lake)}}))[0]


@pytest.mark.slow  # several training rounds: ~6 s
def test_compaction_and_vacuum_between_rounds_bring_back_no_old_rows(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    cfg = _cfg(lake, tiny_model_dir, lake.parent / "models")
    for k in range(3):
        write_transitions(lake, _rows(tokens, range(4 * k, 4 * k + 4)))
    first = train_once(cfg=cfg)
    assert first.version == "v0001" and first.n_transitions == 12

    _compact_and_vacuum(lake)
    assert _sensor_count(lake) == 0
    again = train_once(cfg=cfg, force=True)
    assert again.version is None and again.n_transitions == 0, again

    write_transitions(lake, _rows(tokens, range(12, 15)))
    assert _sensor_count(lake) == 3
    second = train_once(cfg=cfg)
    assert second.version == "v0002" and second.n_transitions == 3
    assert second.version_start == first.version_end  # the previous round's read version, for the record
    assert _sensor_count(lake) == 0


def test_a_group_rewrite_of_trained_transitions_trains_only_its_new_rows(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    cfg = _cfg(lake, tiny_model_dir, lake.parent / "models")
    write_transitions(lake, _rows(tokens, range(0, 4), group="g0") + _rows(tokens, range(4, 8), group="g1"))
    assert train_once(cfg=cfg).n_transitions == 8

    # A late reward re-scores group g0: its rows come back with new advantages, one rollout is new.
    _rewrite_groups(lake, _rows(tokens, range(0, 4), group="g0", advantage=-0.5) + _rows(tokens, range(8, 9)), ["g0"])
    assert _sensor_count(lake) == 1
    second = train_once(cfg=cfg, force=True)
    assert second.version == "v0002" and second.n_transitions == 1

    _rewrite_groups(lake, _rows(tokens, range(0, 4), group="g0") + _rows(tokens, range(8, 9)), ["g0"])
    assert train_once(cfg=cfg, force=True).version is None
    from trainer.lineage import Lineage

    summary = Lineage(Lake(str(lake))).summary("v0002")
    assert summary["transitions"] == 1 and summary["table_versions"] == [second.version_end]


@pytest.mark.slow  # several training rounds: ~13 s
def test_over_several_versions_each_transition_is_consumed_once_and_lineage_joins_in_sql(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    from pipelines.lake.query import run_query

    cfg = _cfg(lake, tiny_model_dir, lake.parent / "models")
    write_transitions(lake, _rows(tokens, range(0, 5)))
    write_transitions(lake, _rows(tokens, range(5, 7), group="g1"))
    rounds = [train_once(cfg=cfg)]
    write_transitions(lake, _rows(tokens, range(7, 10), group="g1"))
    _compact_and_vacuum(lake)
    rounds.append(train_once(cfg=cfg))
    # g1 recomputed with two new rollouts; a client retry delivers one new row twice and one old row again
    _rewrite_groups(lake, _rows(tokens, [*range(5, 10), 10, 11], group="g1", advantage=0.25), ["g1"])
    write_transitions(lake, _rows(tokens, [12, 12, 3]))
    rounds.append(train_once(cfg=cfg))
    _compact_and_vacuum(lake)
    write_transitions(lake, _rows(tokens, range(13, 16), group="g2"))
    rounds.append(train_once(cfg=cfg))
    assert train_once(cfg=cfg, force=True).version is None

    assert [r.n_transitions for r in rounds] == [7, 3, 3, 3]
    assert [r.version for r in rounds] == ["v0001", "v0002", "v0003", "v0004"]
    all_ids = set(
        DeltaTable(f"{lake}/transitions").to_pyarrow_table(columns=["transition_id"])["transition_id"].to_pylist()
    )
    assert len(all_ids) == 16

    sql = Lake(str(lake))
    per_version = run_query(
        sql,
        """SELECT m.version, m.n_transitions, count(*) AS consumed, count(DISTINCT t.transition_id) AS in_table,
                  min(l.table_version) AS read_at, m.train_version_end
           FROM model_versions m
           JOIN training_lineage l ON l.model_version = m.version
           LEFT JOIN (SELECT DISTINCT transition_id FROM transitions) t USING (transition_id)
           GROUP BY ALL ORDER BY m.version""",
    ).to_pylist()
    assert [(r["version"], r["n_transitions"], r["consumed"], r["in_table"]) for r in per_version] == [
        ("v0001", 7, 7, 7),
        ("v0002", 3, 3, 3),
        ("v0003", 3, 3, 3),
        ("v0004", 3, 3, 3),
    ]
    assert all(r["read_at"] == r["train_version_end"] for r in per_version)
    twice = run_query(sql, "SELECT transition_id FROM training_lineage GROUP BY 1 HAVING count(*) > 1")
    assert twice.num_rows == 0
    never = run_query(
        sql, "SELECT DISTINCT transition_id FROM transitions ANTI JOIN training_lineage USING (transition_id)"
    )
    assert never.num_rows == 0
    consumed = run_query(sql, "SELECT transition_id FROM training_lineage")["transition_id"].to_pylist()
    assert sorted(consumed) == sorted(all_ids)


def test_the_same_lake_spelled_relative_and_absolute_continues_training(
    tmp_path: Path, tiny_model_dir: Path, tokens: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lake = tmp_path / "lake"
    write_transitions(lake, _rows(tokens, range(0, 4)))
    first = train_once(cfg=_cfg("lake", tiny_model_dir, tmp_path / "models"))
    assert first.n_transitions == 4

    write_transitions(lake, _rows(tokens, range(4, 6)))
    for spelling in (f"{lake}/", f"file://{lake}"):
        assert Registry(Lake(spelling)).last_trained(f"{spelling}/transitions")["version"] == "v0001"
    second = train_once(cfg=_cfg(f"{lake}/", tiny_model_dir, tmp_path / "models"))
    assert second.n_transitions == 2 and second.version_start == first.version_end
    assert train_once(cfg=_cfg(f"file://{lake}", tiny_model_dir, tmp_path / "models"), force=True).version is None
    assert Registry(Lake("./lake")).get("v0002")["train_table"] == str(lake / "transitions")


def test_registry_finds_the_last_round_under_any_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    reg = Registry(Lake("lake"))
    reg.add(version="v0001", version_number=1, base_model="tiny", kind="lora", path="/m/v0001",
            train_table="lake/transitions", train_version_start=-1, train_version_end=4)  # fmt: skip
    for spelling in (
        str(tmp_path / "lake" / "transitions"),
        f"file://{tmp_path}/lake/transitions/",
        "./lake/transitions",
    ):
        row = Registry(Lake(str(tmp_path / "lake"))).last_trained(spelling)
        assert row is not None and row["train_version_end"] == 4, spelling
