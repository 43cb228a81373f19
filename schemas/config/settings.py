"""The whole settings object: one field per ``agentlake.toml`` section."""

from __future__ import annotations

from pydantic import Field

from schemas.config.base import Section
from schemas.config.dagster import DagsterSettings
from schemas.config.health import HealthSettings
from schemas.config.ingest import IngestSettings
from schemas.config.judge import JudgeSettings
from schemas.config.kafka import KafkaSettings
from schemas.config.lake import LakeSettings, StateSettings
from schemas.config.redaction import RedactionSettings
from schemas.config.servers import CollectorSettings, GatewaySettings
from schemas.config.serving import ModelSettings, ServingSettings, VllmSettings
from schemas.config.tracking import TrackingSettings
from schemas.config.training import CreditSettings, TrainerSettings
from schemas.config.viewer import ViewerSettings


class Settings(Section):
    state: StateSettings = Field(default_factory=StateSettings)
    lake: LakeSettings = Field(default_factory=LakeSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    dagster: DagsterSettings = Field(default_factory=DagsterSettings)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    credit: CreditSettings = Field(default_factory=CreditSettings)
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    viewer: ViewerSettings = Field(default_factory=ViewerSettings)
