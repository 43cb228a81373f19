"""The asset check on served adapters: transitions whose (policy version, adapter hash) the registry
does not know are reported, with the pairs, after a real ingestion on a real broker and Delta tables."""

from __future__ import annotations

import polars as pl
import pytest
from dagster import AssetCheckSeverity, materialize

from pipelines.defs.assets import all_assets, policy
from pipelines.defs.checks import all_checks
from pipelines.defs.resources import resources_from_settings
from schemas.config import Settings
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record
from trainer.registry import Registry

pytestmark = pytest.mark.kafka

REGISTERED, OTHER = "1" * 64, "2" * 64


def _calls(pv: str, sha: str | None) -> list[Call]:
    return [Call(prompt=[1, 2, 3], response=[10, 11], logprobs=[-0.1, -0.2], policy_version=pv, policy_sha256=sha)]


def test_transitions_of_adapters_the_registry_does_not_know_are_reported(settings: Settings) -> None:
    lake = Lake(settings.lake.root)
    Registry(lake).add(
        version="v0001", version_number=1, base_model="tiny", kind="lora", path="/m/v0001", manifest_sha256=REGISTERED
    )
    rollouts = [
        Rollout("known", task_id="t", calls=_calls("policy@v0001", REGISTERED), final_reward=1.0),
        Rollout("unhashed", task_id="t", calls=_calls("policy@v0001", None), final_reward=0.0),
        Rollout("changed", task_id="t", calls=_calls("policy@v0001", OTHER), final_reward=1.0),
        Rollout("foreign", task_id="t", calls=_calls("policy@v0007", REGISTERED), final_reward=0.0),
    ]
    records = [span_record(make_spans(r), key=r.rollout_id) for r in rollouts]
    produce(settings.kafka, settings.kafka.spans_topic, records)

    lake_assets = [a for a in all_assets if a is not policy]  # no round: the check is what is under test
    result = materialize([*lake_assets, *all_checks], resources=resources_from_settings(settings))
    assert result.success
    # The hash came through spans and trajectories into transitions, one per call.
    tr = pl.read_delta(lake.uri("transitions")).sort("rollout_id")
    assert dict(zip(tr["rollout_id"], tr["policy_sha256"], strict=True)) == {
        "changed": OTHER,
        "foreign": REGISTERED,
        "known": REGISTERED,
        "unhashed": None,
    }
    (check,) = [
        ev
        for ev in result.get_asset_check_evaluations()
        if ev.asset_check_key.name == "transitions_served_adapters_known"
    ]
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    meta = {k: v.value for k, v in check.metadata.items()}
    assert meta["rows_with_hash"] == 3 and meta["unknown_rows"] == 2
    assert meta["unknown_pairs"] == [
        {"policy_version": "policy@v0001", "policy_sha256": OTHER, "rows": 1},
        {"policy_version": "policy@v0007", "policy_sha256": REGISTERED, "rows": 1},
    ]
    others = [ev for ev in result.get_asset_check_evaluations() if ev is not check]
    assert others and all(ev.passed for ev in others)
