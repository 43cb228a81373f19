"""Settings: one object read from ``agentlake.toml``, environment variables and the running local stack.

The public API is here: the section classes and ``load_settings``. Inside, one module per concern:

- a module per group of sections (``lake``, ``kafka``, ``ingest``, ``servers``, ``serving``, ``dagster``, ``training``,
  ``judge``, ``redaction``, ``health``, ``tracking``, ``viewer``), gathered by ``settings.Settings``;
- ``loading``: defaults, the running stack, the TOML file and the environment merged, errors named;
- ``secrets``: which settings are secrets, hidden in every error;
- ``stack_file``: the running local stack's file and its reader.

A new setting goes in its section's module; a new section also gets a field in ``settings.Settings``.
"""

from schemas.config.dagster import DagsterSettings
from schemas.config.health import (
    ClipFracCheck,
    EntropyCheck,
    HealthCheckSettings,
    HealthSettings,
    KlCheck,
    RatioCheck,
    RewardHackingCheck,
    RewardShiftCheck,
    ZeroAdvantageCheck,
)
from schemas.config.ingest import IngestSettings
from schemas.config.judge import JudgeSettings
from schemas.config.kafka import KafkaSettings
from schemas.config.lake import LakeSettings, StateSettings
from schemas.config.loading import load_settings
from schemas.config.redaction import RedactionSettings
from schemas.config.servers import CollectorSettings, GatewaySettings, TlsServerSettings
from schemas.config.serving import ModelSettings, ServingSettings, VllmSettings
from schemas.config.settings import Settings
from schemas.config.tracking import TrackingSettings
from schemas.config.training import CreditSettings, TrainerSettings
from schemas.config.viewer import ViewerSettings

__all__ = [
    "ClipFracCheck",
    "CollectorSettings",
    "CreditSettings",
    "DagsterSettings",
    "EntropyCheck",
    "GatewaySettings",
    "HealthCheckSettings",
    "HealthSettings",
    "IngestSettings",
    "JudgeSettings",
    "KafkaSettings",
    "KlCheck",
    "LakeSettings",
    "ModelSettings",
    "RatioCheck",
    "RedactionSettings",
    "RewardHackingCheck",
    "RewardShiftCheck",
    "ServingSettings",
    "Settings",
    "StateSettings",
    "TlsServerSettings",
    "TrackingSettings",
    "TrainerSettings",
    "ViewerSettings",
    "VllmSettings",
    "ZeroAdvantageCheck",
    "load_settings",
]
