"""Credit variants (issue 13): `transitions` rebuilt from the same trajectories under other credit settings.

A variant table equals what `build` makes of the trajectories with its settings (and what credit by hand
gives), leaves the main table alone, records its settings, and is what the trainer reads when pointed at it.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.errors import VariantError
from pipelines.gold.transitions import build
from pipelines.gold.transitions_step import update_transitions
from pipelines.gold.variants import default_name, describe, rebuild_variant, variant_names, variant_table
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import CreditSettings
from schemas.lake import Lake
from schemas.tables import transitions_variant
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from tests.pipelines.test_identity import KAFKA, NOW
from trainer.config import TrainConfig
from trainer.data import read_transitions
from trainer.lineage import Lineage, recorded_credit
from trainer.round import count_pending

# (rollout, task, final reward, number of calls); task "b" has a single rollout
ROLLOUTS = [("r0", "a", 1.0, 3), ("r1", "a", 0.0, 2), ("r2", "a", 0.5, 1), ("r3", "b", 1.0, 2)]
DISCOUNTED_RLOO = CreditSettings(mode="discounted", gamma=0.9, advantage="rloo")


def _records() -> list[KafkaRecord]:
    out = []
    for i, (rid, task, reward, n) in enumerate(ROLLOUTS):
        # each call's prompt is new (no merging), token ids small enough for the tiny test model
        calls = [Call(prompt=[1, i, k], response=[2, k + 3], logprobs=[-0.5, -0.25]) for k in range(n)]
        r = Rollout(rid, task_id=task, calls=calls, final_reward=reward, t0_ns=(1_750_000_000 + i) * 10**9)
        out.append(KafkaRecord("s", 0, i, None, encode(make_spans(r)), []))
    return out


@pytest.fixture()
def lake(tmp_path: Path) -> Lake:
    """A lake whose `transitions` the pipeline built with the default credit (identical, GRPO)."""
    lake = Lake(str(tmp_path / "lake"))
    recs = _records()
    lake.write("spans", decode_spans(recs)[0], txns={"kafka:s:0": recs[-1].offset})
    update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW)
    update_transitions(lake, CreditSettings(), now=NOW)
    return lake


def _read(lake: Lake, table: str) -> pl.DataFrame:
    return pl.read_delta(lake.uri(table)).sort("transition_id")


def _by_hand(gamma: float) -> dict[str, tuple[float, float, float]]:
    """transition id -> (return, baseline, advantage) for discounted credit with RLOO, from the definitions:
    G_t = gamma^(T-1-t) R; b = mean R of the group's other rollouts (R itself when alone);
    A_t = (R - b) gamma^(T-1-t)."""
    out = {}
    for rid, task, reward, n in ROLLOUTS:
        others = [r for x, t, r, _ in ROLLOUTS if t == task and x != rid]
        b = sum(others) / len(others) if others else reward
        for t in range(n):
            w = gamma ** (n - 1 - t)
            out[f"{rid}//{t}"] = (reward * w, b, (reward - b) * w)  # rollout/attempt (none here)/step
    return out


def test_a_variant_is_build_with_its_settings_and_matches_credit_by_hand(lake: Lake) -> None:
    main_before = _read(lake, "transitions")
    main_version = lake.version("transitions")
    res = rebuild_variant(lake, DISCOUNTED_RLOO, name="disc09", now=NOW)
    assert res.table == "transitions__disc09" and res.rows == 8 and res.rollouts == 4

    variant = _read(lake, "transitions__disc09")
    trajectories = pl.read_delta(lake.uri("trajectories"))
    expected = pl.from_arrow(build(trajectories, DISCOUNTED_RLOO, now=NOW).table).sort("transition_id")
    assert variant.equals(expected)  # the pipeline's own credit code, not a second copy

    hand = _by_hand(0.9)
    assert sorted(hand) == variant["transition_id"].to_list()
    for tid, ret, base, adv in variant.select("transition_id", "return", "baseline", "advantage").iter_rows():
        assert (ret, base, adv) == pytest.approx(hand[tid]), tid
    assert set(variant["credit_mode"]) == {"discounted"} and set(variant["advantage_mode"]) == {"rloo"}

    # the main table is untouched: same version, same rows, still identical credit
    assert lake.version("transitions") == main_version
    assert _read(lake, "transitions").equals(main_before)
    assert set(main_before["credit_mode"]) == {"identical"}
    assert not variant["advantage"].equals(main_before["advantage"])


def test_the_settings_a_variant_was_built_with_are_recorded_per_version(lake: Lake) -> None:
    first = rebuild_variant(lake, DISCOUNTED_RLOO, name="exp", now=NOW)
    other = CreditSettings(mode="last_only", advantage="grpo", normalize_std=False)
    second = rebuild_variant(lake, other, name="exp", now=NOW)
    assert second.version == first.version + 1  # a new version of the same variant
    assert set(_read(lake, "transitions__exp")["credit_mode"]) == {"last_only"}  # replaced, not appended
    assert _read(lake, "transitions__exp").height == 8

    assert recorded_credit(lake, "transitions__exp") == other.model_dump()
    assert recorded_credit(lake, "transitions__exp", first.version) == DISCOUNTED_RLOO.model_dump()
    assert recorded_credit(lake, lake.uri("transitions__exp"), first.version)["gamma"] == 0.9  # by URI too
    # the pipeline's own table records what it was built with
    assert recorded_credit(lake, "transitions") == CreditSettings().model_dump()
    info = describe(lake, "exp")
    assert info is not None and info["credit"] == other.model_dump() and info["version"] == second.version
    assert info["trajectories_version"] == lake.version("trajectories") and info["rows"] == 8
    assert describe(lake, "never_built") is None
    assert variant_names(lake) == ["exp"]
    rebuild_variant(lake, DISCOUNTED_RLOO, name="disc09", now=NOW)
    assert variant_names(lake) == ["disc09", "exp"]  # found in storage, the main table not among them


def test_names_derive_from_the_settings_and_the_main_table_is_refused(lake: Lake) -> None:
    assert default_name(DISCOUNTED_RLOO) == "discounted_g0p9_rloo"
    assert default_name(CreditSettings(advantage="grpo", normalize_std=False)) == "identical_grpo_nostd"
    res = rebuild_variant(lake, DISCOUNTED_RLOO, now=NOW)
    assert res.table == "transitions__discounted_g0p9_rloo" and lake.table(res.table) is not None
    for bad in ("main", "transitions"):
        with pytest.raises(VariantError, match="incremental pipeline"):
            rebuild_variant(lake, DISCOUNTED_RLOO, name=bad, now=NOW)
    for bad in ("Disc", "a__b", "x-y", "", "_a"):
        with pytest.raises(VariantError, match="variant name"):
            variant_table(bad)
    with pytest.raises(KeyError, match="unknown table"):
        lake.uri("trajectories__x")  # only `transitions` has variants
    assert transitions_variant("disc09") == "transitions__disc09"


def test_a_running_baseline_variant_starts_fresh(lake: Lake) -> None:
    credit = CreditSettings(advantage="running_baseline")
    update_transitions(lake, credit, now=NOW)  # the main table's baseline has now seen every rollout
    res = rebuild_variant(lake, credit, name="rb", now=NOW, chunk_rollouts=1)
    rows = _read(lake, res.table).unique("rollout_id").sort("rollout_id")
    # r0..r3 were rewarded in that order; the baseline before each is an EMA started empty (pipelines.gold.credit),
    # not the one the main table saved after counting all four
    assert rows["baseline"].to_list() == pytest.approx([0.0, 1.0, 0.5, 0.5])
    assert rows["advantage"].to_list() == pytest.approx([1.0, -1.0, 0.0, 0.5])


def test_the_trainer_reads_a_variant_and_counts_it_apart_from_the_main_table(lake: Lake) -> None:
    res = rebuild_variant(lake, DISCOUNTED_RLOO, name="disc09", now=NOW)
    data = read_transitions(lake, table=res.table)
    assert data.table_uri == lake.uri(res.table) and data.version_end == res.version
    by_id = dict(zip(data.rows["transition_id"].to_pylist(), data.rows["advantage"].to_pylist(), strict=True))
    assert by_id == pytest.approx({tid: v[2] for tid, v in _by_hand(0.9).items()})

    cfg = TrainConfig(lake_root=lake.root, table=res.table, min_new_transitions=1)
    main = TrainConfig(lake_root=lake.root, min_new_transitions=1)
    assert count_pending(cfg) == (8, res.version)
    assert count_pending(main) == (8, lake.version("transitions"))
    # a version trained on the variant: its rows count as consumed there, not in the main table
    lineage = Lineage(lake)
    lineage.record(model_version="v0001", train_table=data.table_uri, table_version=res.version, rows=data.rows)
    assert count_pending(cfg) == (0, res.version)
    assert count_pending(main) == (8, lake.version("transitions"))
    assert lineage.credit("v0001") == {lake.uri(res.table): DISCOUNTED_RLOO.model_dump()}


def test_a_version_trained_on_a_variant_names_it_and_its_credit_settings(lake: Lake, tmp_path: Path) -> None:
    import json

    from tests.trainer.helpers import build_tiny_model_dir
    from trainer.registry import Registry
    from trainer.round import train_once

    res = rebuild_variant(lake, DISCOUNTED_RLOO, name="disc09", now=NOW)
    model = build_tiny_model_dir(tmp_path / "tiny")
    cfg = TrainConfig(
        lake_root=lake.root,
        table=res.table,
        base_model=str(model),
        checkpoint_dir=str(tmp_path / "models"),
        min_new_transitions=1,
        lora_rank=4,
        max_steps=1,
        progress=False,
    )
    out = train_once(cfg=cfg)
    assert out.version == "v0001" and out.n_transitions == 8 and out.version_end == res.version
    row = Registry(lake).get("v0001")
    assert row["train_table"] == lake.uri(res.table)
    recorded = json.loads(row["config"])
    assert recorded["table"] == res.table and recorded["credit"] == DISCOUNTED_RLOO.model_dump()
    assert Lineage(lake).credit("v0001") == {lake.uri(res.table): DISCOUNTED_RLOO.model_dump()}
    assert count_pending(cfg) == (0, res.version)
    assert count_pending(cfg.replace(table="transitions")) == (8, lake.version("transitions"))


def test_trainer_table_setting_points_rounds_at_a_variant(lake: Lake, tmp_path: Path) -> None:
    from schemas.config import load_settings
    from schemas.errors import ConfigError
    from trainer.config import config_from_settings

    res = rebuild_variant(lake, DISCOUNTED_RLOO, name="disc09", now=NOW)
    config = tmp_path / "agentlake.toml"
    body = f'[lake]\nroot = "{lake.root}"\n[state]\ndir = "{tmp_path / "state"}"\n[trainer]\nmin_new_transitions = 1\n'
    config.write_text(body + 'table = "transitions__disc09"\n')
    cfg = config_from_settings(load_settings(str(config)))
    assert cfg.table == res.table and count_pending(cfg) == (8, res.version)
    config.write_text(body + 'table = "spans"\n')
    with pytest.raises(ConfigError, match="table"):
        load_settings(str(config))


def test_the_cli_rebuilds_a_variant_and_shows_its_settings(lake: Lake, tmp_path: Path) -> None:
    config = tmp_path / "agentlake.toml"
    config.write_text(f'[lake]\nroot = "{lake.root}"\n[state]\ndir = "{tmp_path / "state"}"\n')
    runner = CliRunner()
    args = ["transitions", "rebuild", "--credit", "discounted", "--gamma", "0.9", "--advantage", "rloo"]
    out = runner.invoke(app_(), [*args, "--config", str(config)])
    assert out.exit_code == 0, out.output
    assert "transitions__discounted_g0p9_rloo version 0: 8 transitions from 4 rollouts" in out.output
    assert recorded_credit(lake, "transitions__discounted_g0p9_rloo")["advantage"] == "rloo"

    listed = runner.invoke(app_(), ["transitions", "list", "--config", str(config)])
    assert listed.exit_code == 0 and "transitions__discounted_g0p9_rloo" in listed.output
    assert "advantage=rloo" in " ".join(listed.output.split())
    shown = runner.invoke(app_(), ["transitions", "show", "discounted_g0p9_rloo", "--config", str(config)])
    assert shown.exit_code == 0 and '"gamma": 0.9' in shown.output

    compacted = runner.invoke(
        app_(), ["lake", "compact", "--table", "transitions__discounted_g0p9_rloo", "--config", str(config)]
    )
    assert compacted.exit_code == 0 and "transitions__discounted_g0p9_rloo:" in compacted.output
    assert recorded_credit(lake, "transitions__discounted_g0p9_rloo")["gamma"] == 0.9  # a compaction records none

    refused = runner.invoke(app_(), ["transitions", "rebuild", "--name", "main", "--config", str(config)])
    assert refused.exit_code == 1 and "incremental pipeline" in refused.output
    bad = runner.invoke(app_(), [*args[:2], "--gamma", "1.5", "--config", str(config)])
    assert bad.exit_code == 2 and "gamma" in bad.output
    wrong_table = runner.invoke(app_(), ["train", "--once", "--table", "spans", "--config", str(config)])
    assert wrong_table.exit_code == 2 and "--table" in wrong_table.output


def app_():  # noqa: ANN201 - the typer app, imported where used so collecting this file stays light
    from agentlake.cli import app

    return app


def test_forget_and_retention_reach_the_variants_of_transitions(lake: Lake) -> None:
    """A variant is a copy of transition rows: forgetting a rollout or a tenant must remove it there too."""
    import datetime as dt

    from pipelines.lake.forget import forget
    from pipelines.lake.retention import apply_retention

    variant = rebuild_variant(lake, DISCOUNTED_RLOO, name="d09", now=NOW).table
    assert set(_read(lake, variant)["rollout_id"]) == {"r0", "r1", "r2", "r3"}
    done = forget(lake, "default", rollout="r1")
    assert done.tables[variant].rows == 2
    assert "r1" not in set(_read(lake, variant)["rollout_id"]) and "r1" not in set(
        _read(lake, "transitions")["rollout_id"]
    )
    # retention on `transitions` takes its variants along (rows created "now" are all past a 0-day cutoff later)
    apply_retention(lake, {"transitions": 0}, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    assert _read(lake, variant).height == 0 and _read(lake, "transitions").height == 0


def test_a_variant_is_a_view_in_duckdb_and_listed_with_the_tables(lake: Lake) -> None:
    from pipelines.lake.query import list_tables, run_query

    variant = rebuild_variant(lake, DISCOUNTED_RLOO, name="d09", now=NOW).table
    rows = run_query(lake, f"SELECT count(*) AS n FROM {variant}").to_pylist()
    assert rows == [{"n": _read(lake, variant).height}] and rows[0]["n"] > 0
    assert {t.name: t.rows for t in list_tables(lake)}[variant] == rows[0]["n"]
