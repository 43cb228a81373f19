"""Kafka client configs built from the ``[kafka]`` settings: one place for both clients we use.

kafka-python (admin, the trainer's release bus, tests) takes keyword arguments; confluent-kafka
(librdkafka: the collector's producer, ingest's consumer) takes dotted properties. Both get the same
servers, security, record sizes and CRC checks from ``KafkaSettings``, so the two never drift.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from schemas.config import KafkaSettings
from schemas.errors import ConfigError

ClientRole = Literal["admin", "producer", "consumer"]


def _tls_files(kafka: KafkaSettings) -> dict[str, str]:
    """The TLS files that are set, each checked to exist (a clear error now, not a TLS failure later)."""
    files = {k: v for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if (v := getattr(kafka, k))}
    for key, path in files.items():
        if not Path(path).is_file():
            raise ConfigError(f"kafka.{key}: {path} is not a file")
    return files


def kafka_python_config(
    kafka: KafkaSettings, bootstrap: str | None = None, *, role: ClientRole = "admin"
) -> dict[str, Any]:
    """kafka-python arguments for a client of ``role``: servers, security, sizes and CRC checks.

    ``bootstrap`` overrides the servers. Tuning (acks, linger, timeouts) is the caller's.
    """
    cfg: dict[str, Any] = {
        "bootstrap_servers": (bootstrap or kafka.bootstrap_servers).split(","),
        "security_protocol": kafka.security_protocol,
    }
    if kafka.sasl_mechanism:
        cfg.update(
            sasl_mechanism=kafka.sasl_mechanism,
            sasl_plain_username=kafka.sasl_username,
            sasl_plain_password=kafka.sasl_password,
        )
    if kafka.security_protocol.endswith("SSL"):
        cfg["ssl_check_hostname"] = kafka.ssl_check_hostname
        cfg.update(_tls_files(kafka))
        if kafka.ssl_key_password:
            cfg["ssl_password"] = kafka.ssl_key_password
    if role == "producer":
        cfg["max_request_size"] = kafka.max_message_bytes
    elif role == "consumer":
        cfg.update(
            check_crcs=kafka.check_crcs,
            max_partition_fetch_bytes=max(1 << 20, kafka.max_message_bytes),
            fetch_max_bytes=max(50 << 20, kafka.max_message_bytes),
        )
    return cfg


def librdkafka_config(
    kafka: KafkaSettings, bootstrap: str | None = None, *, role: ClientRole = "consumer"
) -> dict[str, Any]:
    """confluent-kafka (librdkafka) properties: the same settings as ``kafka_python_config``, its key names."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap or kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol,
    }
    if kafka.sasl_mechanism:
        cfg.update(
            {
                "sasl.mechanisms": kafka.sasl_mechanism,
                "sasl.username": kafka.sasl_username,
                "sasl.password": kafka.sasl_password,
            }
        )
    if kafka.security_protocol.endswith("SSL"):
        names = {"ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location"}
        names["ssl_keyfile"] = "ssl.key.location"
        cfg.update({names[k]: v for k, v in _tls_files(kafka).items()})
        cfg["enable.ssl.certificate.verification"] = True
        cfg["ssl.endpoint.identification.algorithm"] = "https" if kafka.ssl_check_hostname else "none"
        if kafka.ssl_key_password:
            cfg["ssl.key.password"] = kafka.ssl_key_password
    # librdkafka's message.max.bytes bounds a request it sends (producer) and, with fetch.max.bytes,
    # what it accepts (consumer); a response may be fetch.max.bytes plus protocol overhead.
    cfg["message.max.bytes"] = kafka.max_message_bytes
    if role == "consumer":
        fetch = max(50 << 20, kafka.max_message_bytes)
        cfg.update(
            {
                "check.crcs": kafka.check_crcs,
                "max.partition.fetch.bytes": max(1 << 20, kafka.max_message_bytes),
                "fetch.max.bytes": fetch,
                "receive.message.max.bytes": fetch + (1 << 20),
            }
        )
    return cfg
