"""Dagster resources: the lake, Kafka and the policy tokenizer, configured from agentlake settings.

Assets receive these instead of reading settings themselves, so tests swap in a temporary lake
and a test broker, and a deployment sets them with environment variables.
"""

from __future__ import annotations

import os
from typing import Any

from dagster import ConfigurableResource

from pipelines.lake import Lake
from pipelines.retokenize import Retokenizer, load, tokenizer_dir
from schemas.config import CreditSettings, KafkaSettings, Settings, load_settings
from schemas.errors import ConfigError


class LakeResource(ConfigurableResource):
    """Where the Delta tables live: a folder or an object-store URI plus storage options."""

    root: str
    storage_options: dict[str, str] = {}

    def lake(self) -> Lake:
        return Lake(self.root, dict(self.storage_options))


class KafkaResource(ConfigurableResource):
    """Kafka connection and topic names (the agentlake `kafka` settings section, as JSON-able fields)."""

    bootstrap_servers: str
    spans_topic: str
    rewards_topic: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    batch_records: int = 2000

    def settings(self) -> KafkaSettings:
        # Empty: the code location loaded before `agentlake up`; look for the running stack now.
        bootstrap = self.bootstrap_servers or load_settings().kafka.bootstrap_servers
        if not bootstrap:
            raise ConfigError("no Kafka address: start the stack with `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        return KafkaSettings(
            bootstrap_servers=bootstrap,
            spans_topic=self.spans_topic,
            rewards_topic=self.rewards_topic,
            security_protocol=self.security_protocol,  # type: ignore[arg-type]
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            sasl_password=self.sasl_password,
        )


class PolicyResource(ConfigurableResource):
    """The credit settings and the policy's tokenizer folder (for calls recorded without token ids)."""

    tokenizer_path: str = ""
    credit: dict[str, Any] = {}
    idle_timeout_s: float = 300.0

    def credit_settings(self) -> CreditSettings:
        return CreditSettings(**self.credit)

    def retokenizer(self) -> Retokenizer | None:
        """None when no tokenizer folder exists: such calls are then dropped and counted."""
        if not self.tokenizer_path or not os.path.isdir(self.tokenizer_path):
            return None
        return load(self.tokenizer_path)


class TrainerResource(ConfigurableResource):
    """Trainer and publishing settings; the rest comes from agentlake settings (file and environment)."""

    publish: bool = True
    min_new_transitions: int | None = None

    def settings(self) -> Settings:
        s = load_settings()
        if self.min_new_transitions is not None:
            s.trainer.min_new_transitions = self.min_new_transitions
        return s


def resources_from_settings(settings: Settings | None = None) -> dict[str, ConfigurableResource]:
    """Resources for the code location, read from agentlake.toml and the environment."""
    s = settings or load_settings()
    model_dir = tokenizer_dir(s)
    credit = s.credit.model_dump()
    idle = credit.pop("idle_timeout_s")
    return {
        "lake": LakeResource(root=s.lake.root, storage_options=dict(s.lake.storage_options)),
        "kafka": KafkaResource(
            bootstrap_servers=s.kafka.bootstrap_servers,  # explicit, else the running `agentlake up`
            spans_topic=s.kafka.spans_topic,
            rewards_topic=s.kafka.rewards_topic,
            security_protocol=s.kafka.security_protocol,
            sasl_mechanism=s.kafka.sasl_mechanism,
            sasl_username=s.kafka.sasl_username,
            sasl_password=s.kafka.sasl_password,
        ),
        "policy": PolicyResource(tokenizer_path=model_dir, credit=credit, idle_timeout_s=idle),
        "trainer": TrainerResource(),
    }
