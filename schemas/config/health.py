"""``[health]``: the thresholds of the checks that watch training for collapse (``pipelines.lake.health``).

Each check is a table of its own (``[health.entropy]``, ``[health.kl]``, ...) with ``enabled``, a
``severity`` (``warn`` or ``error``: what Dagster shows when it fires) and its thresholds. A check
without the data it needs (no entropy logged, no held-out eval yet) passes and says why: never a
false alarm.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from schemas.config.base import Section

Severity = Literal["warn", "error"]


class HealthCheckSettings(Section):
    """What every check has: whether it runs, and how loud it is when it fires."""

    enabled: bool = True
    severity: Severity = "warn"


class EntropyCheck(HealthCheckSettings):
    """The newest version's mean response entropy (nats per token) below ``floor``, or below ``drop_factor``
    times the mean of its line's first ``reference_versions`` versions: the policy stopped exploring."""

    floor: float = Field(0.05, ge=0)
    drop_factor: float = Field(0.25, gt=0, lt=1)
    reference_versions: int = Field(2, ge=1)


class KlCheck(HealthCheckSettings):
    """The newest version's KL to the reference model (per token) above ``max_kl``."""

    severity: Severity = "error"
    max_kl: float = Field(0.5, gt=0)


class RatioCheck(HealthCheckSettings):
    """The newest version's mean policy ratio pi/pi_old above ``max_ratio`` or below its inverse."""

    severity: Severity = "error"
    max_ratio: float = Field(2.0, gt=1)


class ClipFracCheck(HealthCheckSettings):
    """The newest version's clip fraction above ``max_clip_frac``, or above ``spike_factor`` times the
    median of its line's previous ``window`` versions."""

    max_clip_frac: float = Field(0.4, gt=0, le=1)
    spike_factor: float = Field(3.0, gt=1)
    window: int = Field(5, ge=1)


class ZeroAdvantageCheck(HealthCheckSettings):
    """The share of the newest policy version's transitions with advantage 0 at least ``max_fraction``
    (every rollout of a group scored alike: nothing to learn), once there are ``min_rows`` of them."""

    max_fraction: float = Field(0.9, gt=0, le=1)
    min_rows: int = Field(16, ge=1)


class RewardShiftCheck(HealthCheckSettings):
    """Per agent, the rewards of its newest ``window`` rollouts against the ``window`` before them: the
    two-sample Kolmogorov-Smirnov statistic above ``max_ks``, once each window holds ``min_rollouts``."""

    window: int = Field(64, ge=2)
    min_rollouts: int = Field(16, ge=2)
    max_ks: float = Field(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _min_fits_window(self) -> RewardShiftCheck:
        if self.min_rollouts > self.window:
            raise ValueError(f"min_rollouts ({self.min_rollouts}) cannot exceed window ({self.window})")
        return self


class RewardHackingCheck(HealthCheckSettings):
    """Over a line's last ``versions`` versions with both scores: the training reward (the mean reward of
    the rollouts each version sampled) rose by more than ``min_train_rise`` while the held-out eval fell by
    more than ``min_eval_drop``."""

    severity: Severity = "error"
    versions: int = Field(3, ge=2)
    min_train_rise: float = Field(0.05, ge=0)
    min_eval_drop: float = Field(0.02, ge=0)


class HealthSettings(Section):
    """The collapse checks on ``transitions`` and ``model_versions`` (``pipelines.defs.health``)."""

    entropy: EntropyCheck = Field(default_factory=EntropyCheck)
    kl: KlCheck = Field(default_factory=KlCheck)
    ratio: RatioCheck = Field(default_factory=RatioCheck)
    clip_frac: ClipFracCheck = Field(default_factory=ClipFracCheck)
    zero_advantage: ZeroAdvantageCheck = Field(default_factory=ZeroAdvantageCheck)
    reward_shift: RewardShiftCheck = Field(default_factory=RewardShiftCheck)
    reward_hacking: RewardHackingCheck = Field(default_factory=RewardHackingCheck)
