"""The collapse checks (``pipelines.defs.health``): each on real Delta tables (``transitions``, ``model_versions``)
evaluated by a real Dagster run of the `health` job, on a run that collapses and on one that does not; the
sensor that starts them on each new table version; their settings' validation."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, DagsterInstance, Definitions, SkipReason, build_sensor_context

from pipelines.defs.assets import policy, transitions
from pipelines.defs.health import health_checks, health_job, health_sensor
from pipelines.defs.resources import resources_from_settings
from schemas.config import Settings, load_settings
from schemas.errors import ConfigError
from schemas.lake import Lake
from schemas.tables import TRANSITIONS
from trainer.registry import Registry, version_name

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# Small windows, so a few rollouts per version decide.
HEALTH = {"reward_shift": {"window": 8, "min_rollouts": 4}, "zero_advantage": {"min_rows": 4}}
CHECKS = sorted(key.name for c in health_checks for key in c.check_keys)


def _settings(tmp_path: Path, health: dict[str, Any] | None = None) -> Settings:
    return load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "lake": {"root": str(tmp_path / "lake")},
            "health": {**HEALTH, **(health or {})},
        },
    )


def transition_row(i: int, *, version: str | None, reward: float, advantage: float, agent: str = "solver") -> dict:
    """One `transitions` row of rollout ``i``, sampled by ``version`` (None: the base model)."""
    at = T0 + dt.timedelta(seconds=i)
    return {
        "transition_id": f"r{i:04d}/a0/0",
        "rollout_id": f"r{i:04d}",
        "attempt_id": "a0",
        "tenant": "default",
        "task_id": f"t{i % 4}",
        "group_id": f"t{i % 4}",
        "step": 0,
        "agent_name": agent,
        "prompt_ids": [1, 2],
        "response_ids": [3],
        "response_logprobs": [-0.5],
        "loss_mask": [1],
        "reward": reward,
        "return": reward,
        "advantage": advantage,
        "policy_version": f"agentlake-policy@{version}" if version else None,
        "llm_model": "tiny",
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "created_at": at,
        "day": at.date(),
    }


def write_run(lake: Lake, *, collapsing: bool) -> None:
    """Three versions and the rollouts each sampled (8 per version).

    Healthy: entropy and held-out steady, KL and ratio small, rewards alternating 0/1 under every version.
    Collapsing: entropy near 0, KL and ratio blown up, clip fraction spiking; training reward 0 -> 0.25 -> 1
    (every rollout of the newest version scores 1: advantage 0) while held-out falls 0.6 -> 0.4."""
    rows: list[dict[str, Any]] = []
    registry = Registry(lake)
    for k in range(1, 4):
        v = version_name(k)
        last = k == 3
        metrics = {
            "final_entropy": 0.01 if collapsing and last else 1.2 - 0.05 * k,
            "final_kl": 2.0 if collapsing and last else 0.01,
            "final_ratio": 5.0 if collapsing and last else 1.01,
            "final_clip_frac": 0.8 if collapsing and last else 0.05,
        }
        registry.add(version=v, version_number=k, base_model="tiny", kind="lora", path=f"/m/{v}", metrics=metrics)
        held_out = 0.7 - 0.1 * k if collapsing else 0.5 + 0.05 * k
        registry.set_status(v, "published", published_at=T0, metrics={"eval_candidate": held_out})
        for j in range(8):
            i = 8 * (k - 1) + j
            if collapsing:
                reward = [0.0, float(j < 2), 1.0][k - 1]
                advantage = 0.0 if last else (reward - 0.25)
            else:
                reward = float(j % 2)
                advantage = reward - 0.5
            rows.append(transition_row(i, version=v, reward=reward, advantage=advantage))
    lake.write("transitions", pa.Table.from_pylist(rows, schema=TRANSITIONS))


def run_checks(settings: Settings) -> dict[str, Any]:
    """Run the `health` job in process on a fresh instance: {check name: its evaluation}."""
    defs = Definitions(
        assets=[transitions, policy],
        asset_checks=health_checks,
        jobs=[health_job],
        resources=resources_from_settings(settings),
    )
    result = defs.resolve_job_def("health").execute_in_process(instance=DagsterInstance.ephemeral())
    assert result.success
    return {ev.asset_check_key.name: ev for ev in result.get_asset_check_evaluations()}


def meta(ev: Any) -> dict[str, Any]:
    return {k: v.value for k, v in ev.metadata.items()}


def test_a_healthy_run_passes_every_check(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    write_run(Lake(settings.lake.root), collapsing=False)
    evals = run_checks(settings)
    assert sorted(evals) == CHECKS
    assert {n: ev.passed for n, ev in evals.items()} == dict.fromkeys(CHECKS, True)
    assert not any(meta(ev)["skipped"] for ev in evals.values())  # each had its data and measured it
    zero = meta(evals["transitions_zero_advantage"])
    assert zero["zero_advantage_fraction"] == 0.0 and zero["policy_version"] == "agentlake-policy@v0003"
    assert meta(evals["transitions_reward_shift"])["ks"] == 0.0
    hacking = meta(evals["model_versions_reward_hacking"])
    assert hacking["versions"] == "v0001..v0003" and hacking["held_out_change"] == pytest.approx(0.1)


def test_a_collapsing_run_fails_every_check_with_its_settings_severity(tmp_path: Path) -> None:
    settings = _settings(tmp_path, {"entropy": {"severity": "error"}, "kl": {"severity": "warn"}})
    write_run(Lake(settings.lake.root), collapsing=True)
    evals = run_checks(settings)
    assert {n: ev.passed for n, ev in evals.items()} == dict.fromkeys(CHECKS, False)
    severity = {n: ev.severity for n, ev in evals.items()}
    assert severity["model_versions_entropy"] == AssetCheckSeverity.ERROR  # set above
    assert severity["model_versions_kl"] == AssetCheckSeverity.WARN  # set above (default error)
    assert severity["model_versions_ratio"] == AssetCheckSeverity.ERROR  # defaults
    assert severity["transitions_zero_advantage"] == AssetCheckSeverity.WARN
    # the measured values sit next to the thresholds
    entropy = meta(evals["model_versions_entropy"])
    assert entropy["entropy"] == 0.01 and entropy["floor"] == 0.05 and entropy["version"] == "v0003"
    assert meta(evals["model_versions_kl"])["kl"] == 2.0 and meta(evals["model_versions_kl"])["max_kl"] == 0.5
    assert meta(evals["model_versions_ratio"])["ratio"] == 5.0
    assert meta(evals["model_versions_clip_frac"])["clip_frac"] == 0.8
    zero = meta(evals["transitions_zero_advantage"])
    assert zero["zero_advantage_fraction"] == 1.0 and zero["rows"] == 8 and zero["max_fraction"] == 0.9
    shift = meta(evals["transitions_reward_shift"])
    assert shift["ks"] == 0.75 and shift["reference_mean"] == 0.25 and shift["recent_mean"] == 1.0
    hacking = meta(evals["model_versions_reward_hacking"])
    assert hacking["train_reward_change"] == 1.0 and hacking["held_out_change"] == pytest.approx(-0.2)
    assert "training reward +1.000, held-out -0.200" in (evals["model_versions_reward_hacking"].description or "")


def test_disabled_checks_pass_and_say_so(tmp_path: Path) -> None:
    off = {name: {"enabled": False} for name in ("entropy", "kl", "ratio", "clip_frac", "reward_hacking")}
    settings = _settings(tmp_path, {**off, "zero_advantage": {"min_rows": 4, "enabled": False}})
    write_run(Lake(settings.lake.root), collapsing=True)
    evals = run_checks(settings)
    assert not evals["transitions_reward_shift"].passed  # still on
    for name in set(CHECKS) - {"transitions_reward_shift"}:
        assert evals[name].passed and "disabled" in (evals[name].description or ""), name


def test_checks_without_data_pass_as_skipped(tmp_path: Path) -> None:
    """No tables; then versions with no entropy or eval recorded: skipped, never a false alarm."""
    settings = _settings(tmp_path)
    evals = run_checks(settings)
    assert all(ev.passed and meta(ev)["skipped"] for ev in evals.values())
    lake = Lake(settings.lake.root)
    Registry(lake).add(version="v0001", version_number=1, base_model="tiny", kind="lora", path="/m", metrics={})
    lake.write(
        "transitions",
        pa.Table.from_pylist(
            [transition_row(i, version="v0001", reward=1.0, advantage=0.0) for i in range(3)], schema=TRANSITIONS
        ),
    )
    evals = run_checks(settings)
    assert all(ev.passed and meta(ev)["skipped"] for ev in evals.values())
    assert "no version recorded a response entropy" in (evals["model_versions_entropy"].description or "")
    assert "fewer than min_rows=4" in (evals["transitions_zero_advantage"].description or "")


def test_the_sensor_runs_the_checks_on_each_new_table_version(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    lake = Lake(settings.lake.root)
    resources = {"lake": resources_from_settings(settings)["lake"]}
    with build_sensor_context(resources=resources) as ctx:
        assert isinstance(health_sensor(ctx), SkipReason)  # no tables yet
    write_run(lake, collapsing=False)
    with build_sensor_context(resources=resources) as ctx:
        first = health_sensor(ctx)
    assert not isinstance(first, SkipReason) and len(first.run_requests or []) == 1
    with build_sensor_context(resources=resources, cursor=first.cursor) as ctx:
        again = health_sensor(ctx)
    assert not isinstance(again, SkipReason) and not again.run_requests  # nothing new
    Registry(lake).set_status("v0003", "rolled_back")  # a write to model_versions
    with build_sensor_context(resources=resources, cursor=first.cursor) as ctx:
        after = health_sensor(ctx)
    assert not isinstance(after, SkipReason) and len(after.run_requests or []) == 1
    assert after.run_requests[0].run_key != first.run_requests[0].run_key  # type: ignore[index]


def test_the_lake_and_train_jobs_leave_the_checks_to_the_sensor() -> None:
    from pipelines.defs.definitions import defs

    ours = set(CHECKS)
    for job in ("lake", "train"):
        keys = {k.name for k in defs.resolve_job_def(job).asset_layer.asset_graph.asset_check_keys}
        assert not keys & ours, job
    health = {k.name for k in defs.resolve_job_def("health").asset_layer.asset_graph.asset_check_keys}
    assert health == ours
    assert "health_sensor" in {s.name for s in defs.sensors or []}


@pytest.mark.parametrize(
    ("health", "message"),
    [
        ({"kl": {"max_kl": 0}}, "health.kl.max_kl"),
        ({"ratio": {"max_ratio": 0.5}}, "health.ratio.max_ratio"),
        ({"zero_advantage": {"max_fraction": 1.5}}, "health.zero_advantage.max_fraction"),
        ({"entropy": {"severity": "loud"}}, "health.entropy.severity"),
        ({"reward_shift": {"window": 4, "min_rollouts": 8}}, "min_rollouts (8) cannot exceed window (4)"),
        ({"clip_frac": {"treshold": 1}}, "health.clip_frac.treshold"),
    ],
)
def test_bad_thresholds_are_config_errors(tmp_path: Path, health: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _settings(tmp_path, health)


@pytest.mark.slow  # a real training round on a tiny model: torch, a few seconds
def test_the_checks_read_what_a_real_round_records(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The keys a round writes to model_versions.metrics are the ones the checks read: measured, not skipped."""
    from tests.trainer.helpers import build_tokenizer, transition, write_transitions
    from trainer.config import TrainConfig
    from trainer.round import train_once

    settings = _settings(tmp_path)
    tok = build_tokenizer()
    prompt, good, bad = (tok(w)["input_ids"] for w in ("what is two plus three", "good yes", "bad"))
    rows = [transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(8)]
    write_transitions(settings.lake.root, rows)
    cfg = TrainConfig(
        lake_root=settings.lake.root,
        base_model=str(tiny_model_dir),
        checkpoint_dir=str(tmp_path / "models"),
        min_new_transitions=1,
        lora_rank=4,
        batch_size=8,
        max_steps=1,
        kl_coef=0.1,
        progress=False,
    )
    assert train_once(cfg=cfg).version == "v0001"
    recorded = Registry(Lake(settings.lake.root)).get("v0001")["metrics"]
    evals = run_checks(settings)
    for name, key in (("kl", "kl"), ("ratio", "ratio"), ("clip_frac", "clip_frac")):
        ev = evals[f"model_versions_{name}"]
        assert ev.passed and not meta(ev)["skipped"], name
        assert meta(ev)[key] == pytest.approx(json.loads(recorded)[f"final_{key}"]), name
    entropy = meta(evals["model_versions_entropy"])
    assert entropy["skipped"] == ("final_entropy" not in recorded)  # measured once the round logs entropy


def test_held_out_scores_come_from_the_evaluations_table_else_the_eval_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an `evaluations` table, the gate's eval_candidate; with one, each version's latest mean on
    the task set evaluated last (another task set's scores do not compare)."""
    from deltalake import write_deltalake

    from pipelines.lake.health import held_out_scores
    from schemas.tables import TABLES

    if "evaluations" not in TABLES:  # a lake from before the table (issue 26's evaluation adds it): known here
        monkeypatch.setitem(TABLES, "evaluations", pa.schema([("version", pa.string()), ("mean", pa.float64())]))

    lake = Lake(str(tmp_path / "lake"))
    registry = Registry(lake)
    for k, score in ((1, 0.5), (2, 0.4)):
        registry.add(version=version_name(k), version_number=k, base_model="tiny", kind="lora", path="/m", metrics={})
        registry.set_status(version_name(k), "published", metrics={"eval_candidate": score})
    assert held_out_scores(lake, registry.rows()) == {"v0001": 0.5, "v0002": 0.4}

    at = [T0 + dt.timedelta(minutes=m) for m in range(4)]
    evaluations = pa.table(
        {
            "version": ["v0001", "v0002", "v0001", "v0002"],
            "task_set": ["old", "old", "hard", "hard"],
            "mean": [0.9, 0.95, 0.61, 0.72],
            "evaluated_at": pa.array(at, pa.timestamp("us", tz="UTC")),
            "n_tasks": [128, 128, 128, 128],
        }
    )
    write_deltalake(lake.uri("evaluations"), evaluations)
    assert held_out_scores(lake, registry.rows()) == {"v0001": 0.61, "v0002": 0.72}
