"""Collapse checks: Dagster asset checks on `transitions` and on `model_versions` (the `policy` asset's
table), and the sensor that runs them whenever either table gets a new Delta version.

Each check is a thin shell over a signal of ``pipelines.lake.health``, its thresholds, severity and
switch from ``[health]`` settings (``HealthResource``). None blocks: a collapsing run is for a person
to look at, the rows are well-formed. The metadata carries the measured values next to the thresholds.

One path runs them: ``health_sensor`` watches the two tables' Delta versions, so a check evaluates after
every write, whoever made it (a `lake` or `train` run, `agentlake train --once`, a publish that records
its eval scores). The `lake` and `train` jobs leave these checks out (``pipelines.defs.automation``).
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetSelection,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset_check,
    define_asset_job,
    sensor,
)

from pipelines.defs.assets import policy, transitions
from pipelines.defs.resources import HealthResource, LakeResource, ViewerResource
from pipelines.lake import health as signals
from schemas.config.health import HealthCheckSettings
from schemas.lake import Lake
from trainer.registry import Registry

WATCHED = ("transitions", "model_versions")  # a new Delta version of either runs the checks


def result(
    finding: signals.Finding, cfg: HealthCheckSettings, section: str, viewer: ViewerResource | None = None
) -> AssetCheckResult:
    """A signal's finding as a check result: its severity from settings, the values as metadata; with ``viewer``,
    each version it names (``version``, ``<line>/version``) also as a link to its page (``<key>_page``)."""
    if not cfg.enabled:
        return AssetCheckResult(
            passed=True,
            severity=AssetCheckSeverity.WARN,
            description=f"disabled ([health.{section}] enabled = false)",
            metadata={"enabled": False},
        )
    meta: dict[str, Any] = {k: v for k, v in finding.values.items() if v is not None}
    meta.update(skipped=finding.skipped, description=finding.description)
    links = {}
    if viewer is not None:
        named = {k: v for k, v in meta.items() if (k == "version" or k.endswith("/version")) and isinstance(v, str)}
        links = {f"{k}_page": viewer.link(f"/versions/{v}") for k, v in named.items()}
    meta = {k: MetadataValue.text(v) if isinstance(v, str) else v for k, v in meta.items()}
    return AssetCheckResult(
        passed=not finding.fired,
        severity=AssetCheckSeverity.ERROR if cfg.severity == "error" else AssetCheckSeverity.WARN,
        description=finding.description,
        metadata={**meta, **links},
    )


def _versions(lake: Lake) -> pl.DataFrame:
    rows = Registry(lake).rows()
    return signals.version_frame(rows, signals.held_out_scores(lake, rows))


def _transitions(lake: Lake) -> pl.LazyFrame | None:
    scan = lake.scan("transitions")
    return None if scan is None else scan.select(signals.TRANSITION_COLUMNS)


def _no_transitions(section: str, cfg: HealthCheckSettings) -> AssetCheckResult:
    return result(signals.skipped("no transitions table yet"), cfg, section)


@asset_check(
    asset=transitions,
    blocking=False,
    description="Share of the newest policy version's transitions with advantage 0 ([health.zero_advantage]).",
)
def transitions_zero_advantage(lake: LakeResource, health: HealthResource) -> AssetCheckResult:
    cfg = health.settings().zero_advantage
    rows = _transitions(lake.lake())
    if rows is None:
        return _no_transitions("zero_advantage", cfg)
    return result(signals.zero_advantage(rows, cfg), cfg, "zero_advantage")


@asset_check(
    asset=transitions,
    blocking=False,
    description="Per agent, the newest rollouts' reward distribution against the ones before "
    "([health.reward_shift], a KS statistic).",
)
def transitions_reward_shift(lake: LakeResource, health: HealthResource) -> AssetCheckResult:
    cfg = health.settings().reward_shift
    rows = _transitions(lake.lake())
    if rows is None:
        return _no_transitions("reward_shift", cfg)
    return result(signals.reward_shift(signals.rollout_rewards(rows), cfg), cfg, "reward_shift")


@asset_check(
    asset=policy,
    blocking=False,
    description="model_versions: the newest version's response entropy, against a floor and its line's first "
    "versions ([health.entropy]).",
)
def model_versions_entropy(lake: LakeResource, health: HealthResource, viewer: ViewerResource) -> AssetCheckResult:
    cfg = health.settings().entropy
    finding = signals.per_line(_versions(lake.lake()), lambda v: signals.entropy_collapse(v, cfg))
    return result(finding, cfg, "entropy", viewer)


@asset_check(
    asset=policy,
    blocking=False,
    description="model_versions: the newest version's KL to the reference model ([health.kl]).",
)
def model_versions_kl(lake: LakeResource, health: HealthResource, viewer: ViewerResource) -> AssetCheckResult:
    cfg = health.settings().kl
    return result(signals.per_line(_versions(lake.lake()), lambda v: signals.kl_blowup(v, cfg)), cfg, "kl", viewer)


@asset_check(
    asset=policy,
    blocking=False,
    description="model_versions: the newest version's mean policy ratio pi/pi_old ([health.ratio]).",
)
def model_versions_ratio(lake: LakeResource, health: HealthResource, viewer: ViewerResource) -> AssetCheckResult:
    cfg = health.settings().ratio
    finding = signals.per_line(_versions(lake.lake()), lambda v: signals.ratio_blowup(v, cfg))
    return result(finding, cfg, "ratio", viewer)


@asset_check(
    asset=policy,
    blocking=False,
    description="model_versions: the newest version's clip fraction, against a ceiling and its line's "
    "previous versions ([health.clip_frac]).",
)
def model_versions_clip_frac(lake: LakeResource, health: HealthResource, viewer: ViewerResource) -> AssetCheckResult:
    cfg = health.settings().clip_frac
    finding = signals.per_line(_versions(lake.lake()), lambda v: signals.clip_frac_spike(v, cfg))
    return result(finding, cfg, "clip_frac", viewer)


@asset_check(
    asset=policy,
    blocking=False,
    description="model_versions: training reward rising across a line's last versions while their held-out "
    "eval falls ([health.reward_hacking]).",
)
def model_versions_reward_hacking(
    lake: LakeResource, health: HealthResource, viewer: ViewerResource
) -> AssetCheckResult:
    cfg = health.settings().reward_hacking
    the_lake = lake.lake()
    rows = _transitions(the_lake)
    if rows is None:
        return _no_transitions("reward_hacking", cfg)
    train = signals.training_rewards(signals.rollout_rewards(rows))
    finding = signals.per_line(_versions(the_lake), lambda v: signals.reward_hacking(v, train, cfg))
    return result(finding, cfg, "reward_hacking", viewer)


health_checks: list[AssetChecksDefinition] = [
    transitions_zero_advantage,
    transitions_reward_shift,
    model_versions_entropy,
    model_versions_kl,
    model_versions_ratio,
    model_versions_clip_frac,
    model_versions_reward_hacking,
]
health_selection = AssetSelection.checks(*health_checks)
health_job = define_asset_job("health", selection=health_selection, description="The collapse checks.")


def table_versions(lake: Lake) -> dict[str, int | None]:
    """The Delta version of each watched table (None: not created yet): the sensor's cursor."""
    return {table: lake.version(table) for table in WATCHED}


@sensor(
    job=health_job,
    # a run is a process importing the code location (seconds of CPU): not after every lake run of a busy loop
    minimum_interval_seconds=120,
    default_status=DefaultSensorStatus.RUNNING,
    description="Runs the collapse checks when `transitions` or `model_versions` has a new Delta version.",
)
def health_sensor(context: SensorEvaluationContext, lake: LakeResource) -> SensorResult | SkipReason:
    versions = table_versions(lake.lake())
    if all(v is None for v in versions.values()):
        return SkipReason("no transitions or model_versions table yet")
    cursor = json.dumps(versions, sort_keys=True)
    if cursor == context.cursor:
        return SensorResult(skip_reason=SkipReason(f"no new table versions since {cursor}"), cursor=cursor)
    key = "health-" + "-".join(f"{t}{v}" for t, v in sorted(versions.items()))
    return SensorResult(run_requests=[RunRequest(run_key=key)], cursor=cursor)
