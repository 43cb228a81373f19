"""Dagster resources: the lake, Kafka and the policy tokenizer, configured from agentlake settings.

Assets receive these instead of reading settings themselves, so tests swap in a temporary lake
and a test broker, and a deployment sets them with environment variables.
"""

from __future__ import annotations

import json
import os
from typing import Any

from dagster import ConfigurableResource

from pipelines.lake import Lake
from pipelines.retokenize import Retokenizer, load, tokenizer_dir
from schemas.config import CreditSettings, KafkaSettings, Settings, load_settings
from schemas.errors import ConfigError, LakeError


class LakeResource(ConfigurableResource):
    """Where the Delta tables live: a folder or an object-store URI plus storage options.

    From settings (``resources_from_settings``): under `agentlake up` the stack's lake (by default the
    local object store's bucket, its options in ``AGENTLAKE_LAKE__STORAGE_OPTIONS``). ``unavailable``
    carries why a local store's lake cannot be reached (it is stopped), so a run says so at once.
    """

    root: str
    storage_options: dict[str, str] = {}
    unavailable: str = ""

    def lake(self) -> Lake:
        if self.unavailable:
            raise LakeError(self.unavailable)
        return Lake(self.root, dict(self.storage_options))


# Kept out of the resource's config (which Dagster shows): read again from this process's settings.
KAFKA_SECRETS = ("sasl_password", "ssl_key_password")


class KafkaResource(ConfigurableResource):
    """The agentlake `kafka` settings section: servers and topics, and the rest (security, TLS files,
    sizes, CRC checks) as JSON in ``options_json``, so every Kafka setting reaches ingestion's clients.
    The passwords are not part of it: they come from the environment or agentlake.toml of the process."""

    bootstrap_servers: str
    spans_topic: str
    rewards_topic: str
    options_json: str = "{}"
    batch_records: int = 2000

    def settings(self) -> KafkaSettings:
        loaded = load_settings().kafka
        # Empty: the code location loaded before `agentlake up`; look for the running stack now.
        bootstrap = self.bootstrap_servers or loaded.bootstrap_servers
        if not bootstrap:
            raise ConfigError("no Kafka address: start the stack with `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        options = json.loads(self.options_json)
        return KafkaSettings(
            **options,
            **{key: getattr(loaded, key) for key in KAFKA_SECRETS},
            bootstrap_servers=bootstrap,
            spans_topic=self.spans_topic,
            rewards_topic=self.rewards_topic,
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
        "lake": LakeResource(
            root=s.lake.root, storage_options=dict(s.lake.storage_options), unavailable=s.lake.unavailable or ""
        ),
        "kafka": KafkaResource(
            bootstrap_servers=s.kafka.bootstrap_servers,  # explicit, else the running `agentlake up`
            spans_topic=s.kafka.spans_topic,
            rewards_topic=s.kafka.rewards_topic,
            options_json=s.kafka.model_dump_json(
                exclude={"bootstrap_servers", "spans_topic", "rewards_topic", *KAFKA_SECRETS}
            ),
        ),
        "policy": PolicyResource(tokenizer_path=model_dir, credit=credit, idle_timeout_s=idle),
        "trainer": TrainerResource(),
    }
