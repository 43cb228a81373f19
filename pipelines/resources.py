"""Dagster resources: the lake, Kafka and the policy tokenizer, configured from agentlake settings.

Assets receive these instead of reading settings themselves, so tests swap in a temporary lake
and a test broker, and a deployment sets them with environment variables.

Secrets (Kafka's passwords, the lake's secret storage options) never enter a resource's config,
which Dagster stores and shows: they reach the resources as ``EnvVar``s, and Dagster shows only
the variable's name. A secret the operator set as ``AGENTLAKE_KAFKA__SASL_PASSWORD`` (or
``AGENTLAKE_KAFKA__SSL_KEY_PASSWORD``) is named as it is; one from agentlake.toml or the local stack
is put into this process's environment as ``SECRET_AGENTLAKE_<SECTION>__<KEY>`` (every process that
builds these resources loads the code location, so it sets the variable before reading it).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from dagster import ConfigurableResource, EnvVar

from pipelines.retokenize import Retokenizer, load, tokenizer_dir
from schemas.config import ENV_PREFIX, CreditSettings, KafkaSettings, Settings, load_settings
from schemas.errors import ConfigError, LakeError
from schemas.lake import Lake

SECRET_ENV_PREFIX = "SECRET_AGENTLAKE_"
# Storage options that are credentials (delta-rs / object_store keys): AWS_SECRET_ACCESS_KEY,
# AWS_SESSION_TOKEN, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, GOOGLE_SERVICE_ACCOUNT_KEY ...
_SECRET_OPTION = re.compile(r"secret|password|token|sas|_key$", re.IGNORECASE)


def is_secret_option(key: str) -> bool:
    """True for a storage option that holds a credential (an access key id is not one)."""
    return bool(_SECRET_OPTION.search(key))


def secret_env(section: str, key: str, value: str) -> EnvVar:
    """``value`` as an environment variable Dagster reads by name: the operator's own when it holds
    this value, else ``SECRET_AGENTLAKE_<SECTION>__<KEY>`` set in this process."""
    own = f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
    if os.environ.get(own) == value:
        return EnvVar(own)
    name = f"{SECRET_ENV_PREFIX}{section.upper()}__{key.upper()}"
    os.environ[name] = value
    return EnvVar(name)


def _resolved(value: str) -> str:
    """A secret field's value: an ``EnvVar`` read now (a resource used outside Dagster), else itself."""
    return (value.get_value() or "") if isinstance(value, EnvVar) else value


class LakeResource(ConfigurableResource):
    """Where the Delta tables live: a folder or an object-store URI plus storage options.

    From settings (``resources_from_settings``): under `agentlake up` the stack's lake (by default the
    local object store's bucket, its options in ``AGENTLAKE_LAKE__STORAGE_OPTIONS``). ``unavailable``
    carries why a local store's lake cannot be reached (it is stopped), so a run says so at once.
    ``secret_options``: the credential options as JSON, an ``EnvVar`` (never plain config).
    """

    root: str
    storage_options: dict[str, str] = {}
    secret_options: str = ""
    unavailable: str = ""

    def options(self) -> dict[str, str]:
        """Every storage option, the secret ones included."""
        secrets = _resolved(self.secret_options)
        return {**self.storage_options, **(json.loads(secrets) if secrets else {})}

    def lake(self) -> Lake:
        if self.unavailable:
            raise LakeError(self.unavailable)
        return Lake(self.root, self.options())


# Kept out of the resource's JSON options (which Dagster shows): EnvVar fields of their own.
KAFKA_SECRETS = ("sasl_password", "ssl_key_password")


class KafkaResource(ConfigurableResource):
    """The agentlake `kafka` settings section: servers and topics, and the rest (security, TLS files,
    sizes, CRC checks) as JSON in ``options_json``, so every Kafka setting reaches ingestion's clients.
    The passwords are not part of it: ``sasl_password`` / ``ssl_key_password`` are ``EnvVar``s (empty:
    read from this process's settings)."""

    bootstrap_servers: str
    spans_topic: str
    rewards_topic: str
    options_json: str = "{}"
    batch_records: int = 2000
    sasl_password: str = ""
    ssl_key_password: str = ""

    def settings(self) -> KafkaSettings:
        loaded = load_settings().kafka
        # Empty: the code location loaded before `agentlake up`; look for the running stack now.
        bootstrap = self.bootstrap_servers or loaded.bootstrap_servers
        if not bootstrap:
            raise ConfigError("no Kafka address: start the stack with `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        options = json.loads(self.options_json)
        return KafkaSettings(
            **options,
            **{key: _resolved(getattr(self, key)) or getattr(loaded, key) for key in KAFKA_SECRETS},
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
    options = {k: v for k, v in s.lake.storage_options.items() if not is_secret_option(k)}
    secret_options = {k: v for k, v in s.lake.storage_options.items() if is_secret_option(k)}
    kafka_secrets = {key: secret_env("kafka", key, v) for key in KAFKA_SECRETS if (v := getattr(s.kafka, key))}
    return {
        "lake": LakeResource(
            root=s.lake.root,
            storage_options=options,
            secret_options=secret_env("lake", "storage_options", json.dumps(secret_options)) if secret_options else "",
            unavailable=s.lake.unavailable or "",
        ),
        "kafka": KafkaResource(
            bootstrap_servers=s.kafka.bootstrap_servers,  # explicit, else the running `agentlake up`
            spans_topic=s.kafka.spans_topic,
            rewards_topic=s.kafka.rewards_topic,
            options_json=s.kafka.model_dump_json(
                exclude={"bootstrap_servers", "spans_topic", "rewards_topic", *KAFKA_SECRETS}
            ),
            **kafka_secrets,
        ),
        "policy": PolicyResource(tokenizer_path=model_dir, credit=credit, idle_timeout_s=idle),
        "trainer": TrainerResource(),
    }
