"""Dagster resources: the clients assets and sensors use (the lake, Kafka consumers, credit settings,
the policy's tokenizer, the trainer, the viewer's address for links), configured once from agentlake
settings when the code location loads.

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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster import ConfigurableResource, EnvVar, MetadataValue

from pipelines.bronze.offset_hints import make_consumer
from pipelines.gold.estimators import get_estimator
from pipelines.gold.retokenize import Retokenizer, chat_template_file, load, tokenizer_dir
from pipelines.gold.token_check import TokenizeEndpoint
from schemas.config import (
    CreditSettings,
    HealthSettings,
    JudgeSettings,
    KafkaSettings,
    Settings,
    ViewerSettings,
    load_settings,
)
from schemas.config.loading import ENV_PREFIX
from schemas.errors import ConfigError, LakeError
from schemas.lake import Lake
from schemas.storage import is_secret_option

SECRET_ENV_PREFIX = "SECRET_AGENTLAKE_"


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
    """The lake's client: hands out the ``Lake`` (a folder or an object-store URI plus storage options)
    and knows how long each table keeps its rows (``retention_days``, the nightly maintenance's) and how
    many recent days the hourly compaction rewrites (``compact_days``).

    From settings (``resources_from_settings``): under `agentlake up` the stack's lake (by default the
    local object store's bucket, its options in ``AGENTLAKE_LAKE__STORAGE_OPTIONS``). ``unavailable``
    carries why a local store's lake cannot be reached (it is stopped), so a run says so at once.
    ``secret_options``: the credential options as JSON, an ``EnvVar`` (never plain config).
    """

    root: str
    storage_options: dict[str, str] = {}
    secret_options: str = ""
    unavailable: str = ""
    retention_days: dict[str, int] = {}
    compact_days: int = 2

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


def running_stack_kafka() -> KafkaSettings:
    """The Kafka section as settings load now, the running `agentlake up` included.

    For a code location that loaded before `agentlake up` started the local broker: its settings had
    no Kafka address then, and the stack file names one now. The only settings read at run time.
    """
    return load_settings().kafka


class KafkaResource(ConfigurableResource):
    """Kafka's client: the `kafka` settings section (``settings()``, what ingestion's clients are built
    from) and group-less consumers (``consumer()``). Servers and topics are fields; the rest (security,
    TLS files, sizes, CRC checks) is JSON in ``options_json``. The passwords are not part of it:
    ``sasl_password`` / ``ssl_key_password`` are ``EnvVar``s. No servers: the running stack's
    (``running_stack_kafka``)."""

    bootstrap_servers: str
    spans_topic: str
    rewards_topic: str
    options_json: str = "{}"
    batch_records: int = 2000
    ingest_workers: int = 1  # `[ingest] workers`: processes that share each topic's partitions
    ingest_decoders: int = -1  # `[ingest] decoders`: decoder processes per worker (-1: the default split)
    sasl_password: str = ""
    ssl_key_password: str = ""

    def settings(self) -> KafkaSettings:
        stack = None if self.bootstrap_servers else running_stack_kafka()
        bootstrap = self.bootstrap_servers or (stack.bootstrap_servers if stack else "")
        if not bootstrap:
            raise ConfigError("no Kafka address: start the stack with `agentlake up` or set KAFKA_BOOTSTRAP_SERVERS")
        passwords = {
            key: _resolved(getattr(self, key)) or (getattr(stack, key) if stack else "") for key in KAFKA_SECRETS
        }
        return KafkaSettings(
            **json.loads(self.options_json),
            **passwords,
            bootstrap_servers=bootstrap,
            spans_topic=self.spans_topic,
            rewards_topic=self.rewards_topic,
        )

    @contextmanager
    def consumer(self) -> Iterator[Any]:
        """A kafka-python consumer with no group (offset look-ups and probes), closed afterwards."""
        consumer = make_consumer(self.settings())
        try:
            yield consumer
        finally:
            consumer.close()


class CreditResource(ConfigurableResource):
    """How rewards become returns and advantages, and when an idle rollout times out (``credit`` settings);
    and the LLM judge, a reward function of the `reward_functions` asset (``judge``, its url and model
    resolved; its API key stays in the environment variable the settings name)."""

    credit: dict[str, Any] = {}
    judge: dict[str, Any] = {}

    def settings(self) -> CreditSettings:
        """The credit settings, refused here (naming the known estimators) when no estimator has that name."""
        credit = CreditSettings(**self.credit)
        get_estimator(credit.advantage)
        return credit

    def judge_settings(self) -> JudgeSettings | None:
        """The judge's settings when it is enabled, else None."""
        judge = JudgeSettings(**self.judge)
        return judge if judge.enabled else None


class TokenizerResource(ConfigurableResource):
    """The policy's tokenizer folder, for LLM calls recorded without token ids (retokenized), and the chat
    template in place of the folder's own (``model.chat_template``; "": the folder's)."""

    path: str = ""
    chat_template: str = ""
    verify_url: str = ""  # the policy's vLLM (vllm.url), whose /tokenize verifies retokenized calls
    verify_model: str = ""  # a model name it serves with the policy's tokenizer (model.base_served_name)

    def retokenizer(self) -> Retokenizer | None:
        """None when no tokenizer folder exists: such calls are then dropped and counted."""
        if not self.path or not os.path.isdir(self.path):
            return None
        return load(self.path, self.chat_template)

    def verifier(self, credit: CreditSettings) -> TokenizeEndpoint | None:
        """A fresh endpoint per run (its memo and its "server down" last one run), or None when off."""
        if not credit.verify_tokens or not self.verify_url:
            return None
        return TokenizeEndpoint(self.verify_url, self.verify_model, timeout_s=credit.verify_timeout_s)


class TrainerResource(ConfigurableResource):
    """Training rounds and publishing: the settings they read, taken once when the code location loads.

    The sections the trainer and the publisher read (``trainer``, ``model``, ``vllm``, ``gateway``, ``serving``
    and the state folder) are fields; the lake and Kafka are the resources above; the gateway's admin token
    is an ``EnvVar``. ``min_new_transitions`` overrides ``trainer.min_new_transitions``.
    """

    lake: LakeResource
    kafka: KafkaResource
    trainer: dict[str, Any] = {}
    model: dict[str, Any] = {}
    vllm: dict[str, Any] = {}
    gateway: dict[str, Any] = {}
    serving: dict[str, Any] = {}  # replicas: publish through the release bus (the eval gate on the canary)
    state_dir: str = ".agentlake"
    gateway_admin_token: str = ""
    publish: bool = True
    min_new_transitions: int | None = None
    tracking: dict[str, Any] = {}  # [tracking]: the experiment tracker of each round (trainer.trackers)
    viewer: dict[str, Any] = {}  # [viewer]: where the metadata's links to the version's page point

    def settings(self) -> Settings:
        """The settings ``trainer.round.train_once`` and ``serving.publish.gated_publisher`` take."""
        lake = self.lake.lake()  # a stopped local store is an error now, not a refused connection later
        try:
            kafka = self.kafka.settings()
        except ConfigError:  # no broker anywhere: a round trains all the same, and sends no release event
            kafka = KafkaSettings()
        trainer = dict(self.trainer)
        if self.min_new_transitions is not None:
            trainer["min_new_transitions"] = self.min_new_transitions
        return Settings.model_validate(
            {
                "state": {"dir": self.state_dir},
                "lake": {"root": lake.root, "storage_options": dict(lake.storage_options)},
                "kafka": kafka.model_dump(),
                "trainer": trainer,
                "model": self.model,
                "vllm": self.vllm,
                "gateway": {**self.gateway, "admin_token": _resolved(self.gateway_admin_token)},
                "serving": self.serving,
                "tracking": self._tracking(),
                "viewer": viewer_settings(self.viewer, self.state_dir).model_dump(),
            }
        )

    def _tracking(self) -> dict[str, Any]:
        """``[tracking]``, with the running stack's MLflow server when no URI is set: read at each run, so a
        server started (or moved to another port) after the code location loaded is still found."""
        from schemas.config.stack_file import live_stack

        tracking = dict(self.tracking)
        if not tracking.get("uri"):
            uri = live_stack(self.state_dir)[0].get("tracking", {}).get("uri")
            if uri:
                tracking["uri"] = uri
        return tracking


class HealthResource(ConfigurableResource):
    """The collapse checks' thresholds (``[health]`` settings, ``pipelines.defs.health``), validated when read."""

    health: dict[str, Any] = {}

    def settings(self) -> HealthSettings:
        return HealthSettings(**self.health)


def viewer_settings(viewer: dict[str, Any], state_dir: str) -> ViewerSettings:
    """``[viewer]`` as links need it: its ``public_url`` when set, else the running stack's viewer (its stack
    file, read at each run: a viewer started or moved after the code location loaded is still found)."""
    from schemas.config.stack_file import live_stack

    values = dict(viewer)
    if not values.get("public_url"):
        values.update(live_stack(state_dir)[0].get("viewer", {}))
    return ViewerSettings.model_validate(values)


class ViewerResource(ConfigurableResource):
    """Where the trajectory viewer's pages are, for links in check metadata (``MetadataValue.url``)."""

    viewer: dict[str, Any] = {}  # [viewer] settings
    state_dir: str = ".agentlake"

    def link(self, path: str) -> MetadataValue:
        """A metadata link to the viewer's ``path`` (``/versions/v0003``, ``/rollouts/r-1``)."""
        return MetadataValue.url(viewer_settings(self.viewer, self.state_dir).link(path))


def resources_from_settings(settings: Settings | None = None) -> dict[str, ConfigurableResource]:
    """Resources for the code location, read from agentlake.toml and the environment."""
    s = settings or load_settings()
    options = {k: v for k, v in s.lake.storage_options.items() if not is_secret_option(k)}
    secret_options = {k: v for k, v in s.lake.storage_options.items() if is_secret_option(k)}
    # Any: passed as **kwargs, which mypy checks against every keyword of the resource, not the two named
    kafka_secrets: dict[str, Any] = {
        key: secret_env("kafka", key, v) for key in KAFKA_SECRETS if (v := getattr(s.kafka, key))
    }
    lake = LakeResource(
        root=s.lake.root,
        storage_options=options,
        secret_options=secret_env("lake", "storage_options", json.dumps(secret_options)) if secret_options else "",
        unavailable=s.lake.unavailable or "",
        retention_days=dict(s.lake.retention_days),
        compact_days=s.lake.compact_days,
    )
    kafka = KafkaResource(
        bootstrap_servers=s.kafka.bootstrap_servers,  # explicit, else the running `agentlake up`
        spans_topic=s.kafka.spans_topic,
        rewards_topic=s.kafka.rewards_topic,
        options_json=s.kafka.model_dump_json(
            exclude={"bootstrap_servers", "spans_topic", "rewards_topic", *KAFKA_SECRETS}
        ),
        ingest_workers=s.ingest.workers,
        ingest_decoders=s.ingest.decoders,
        **kafka_secrets,
    )
    admin = s.gateway.admin_token
    return {
        "lake": lake,
        "kafka": kafka,
        "credit": CreditResource(
            credit=s.credit.model_dump(mode="json", exclude_none=True),
            judge=s.judge.resolved(s.vllm.url, s.model.base_served_name).model_dump(mode="json"),
        ),
        "tokenizer": TokenizerResource(
            path=tokenizer_dir(s),
            chat_template=chat_template_file(s),
            verify_url=s.vllm.url,
            verify_model=s.model.base_served_name,
        ),
        "trainer": TrainerResource(
            lake=lake,
            kafka=kafka,
            trainer=s.trainer.model_dump(mode="json", exclude_none=True),
            model=s.model.model_dump(mode="json", exclude_none=True),
            vllm=s.vllm.model_dump(mode="json", exclude_none=True),
            gateway=s.gateway.model_dump(mode="json", exclude={"admin_token"}, exclude_none=True),
            serving=s.serving.model_dump(mode="json", exclude_none=True),
            tracking=s.tracking.model_dump(mode="json", exclude_none=True),
            viewer=s.viewer.model_dump(mode="json"),
            state_dir=str(s.state.dir),
            gateway_admin_token=secret_env("gateway", "admin_token", admin) if admin else "",
        ),
        "health": HealthResource(health=s.health.model_dump(mode="json")),
        "viewer": ViewerResource(viewer=s.viewer.model_dump(mode="json"), state_dir=str(s.state.dir)),
    }
