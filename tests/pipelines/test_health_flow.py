"""The zero-advantage and reward-shift checks on transitions the pipeline built: spans on a real broker,
ingested by a real Dagster run into real Delta tables, then the `health` job's checks on them."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import materialize

from pipelines.defs.assets import all_assets, policy
from pipelines.defs.health import transitions_reward_shift, transitions_zero_advantage
from pipelines.defs.resources import resources_from_settings
from schemas.config import Settings
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record

pytestmark = pytest.mark.kafka


def _ingest_and_check(settings: Settings, rewards: list[float]) -> dict[str, Any]:
    """One task's rollouts (one call each, sampled by v0001) with ``rewards``: the lake run, then the checks."""
    rollouts = [
        Rollout(
            f"r{i}",
            task_id="t",
            calls=[Call(prompt=[1, 2, 3], response=[10, 11], logprobs=[-0.1, -0.2], policy_version="p@v0001")],
            final_reward=reward,
        )
        for i, reward in enumerate(rewards)
    ]
    produce(
        settings.kafka, settings.kafka.spans_topic, [span_record(make_spans(r), key=r.rollout_id) for r in rollouts]
    )
    settings.health.zero_advantage.min_rows = 4
    lake_assets = [a for a in all_assets if a is not policy]
    result = materialize(
        [*lake_assets, transitions_zero_advantage, transitions_reward_shift],
        resources=resources_from_settings(settings),
    )
    assert result.success
    return {ev.asset_check_key.name: ev for ev in result.get_asset_check_evaluations()}


def test_a_group_that_all_scored_alike_trips_the_zero_advantage_check(settings: Settings) -> None:
    evals = _ingest_and_check(settings, [1.0] * 6)
    zero = evals["transitions_zero_advantage"]
    assert not zero.passed
    meta = {k: v.value for k, v in zero.metadata.items()}
    assert meta["rows"] == 6 and meta["zero_advantage_fraction"] == 1.0 and meta["policy_version"] == "p@v0001"
    shift = evals["transitions_reward_shift"]  # 6 rollouts: too few for two windows of 16
    assert shift.passed and shift.metadata["skipped"].value


def test_a_group_with_spread_rewards_passes(settings: Settings) -> None:
    evals = _ingest_and_check(settings, [1.0, 0.0] * 3)
    zero = evals["transitions_zero_advantage"]
    assert zero.passed and zero.metadata["zero_advantage_fraction"].value == 0.0
