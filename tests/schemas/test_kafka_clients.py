"""One place builds both Kafka clients' configs: the same settings reach kafka-python and librdkafka.

Pure tests of ``schemas.kafka.kafka_python_config`` / ``librdkafka_config``, then the real clients built from
them (their constructors reject unknown keys; librdkafka loads the TLS files when it is created),
then every construction site of the codebase built from SASL_SSL settings with real files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.config import KafkaSettings, Settings, load_settings
from schemas.errors import ConfigError
from schemas.kafka import kafka_python_config, librdkafka_config
from tests.tls import KEY_PASSWORD, TlsFiles, make_tls_files

pytest.importorskip("cryptography")

# kafka-python key -> librdkafka key, for every setting both clients take.
SAME = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanisms",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def security_cases(tls: TlsFiles) -> dict[str, dict[str, Any]]:
    sasl = {"sasl_username": "agent", "sasl_password": "s3cret"}
    mtls = {
        "ssl_cafile": str(tls.ca),
        "ssl_certfile": str(tls.client_cert),
        "ssl_keyfile": str(tls.client_key),
        "ssl_key_password": KEY_PASSWORD,
    }
    return {
        "plaintext": {},
        "ssl-system-ca": {"security_protocol": "SSL"},
        "ssl-ca": {"security_protocol": "SSL", "ssl_cafile": str(tls.ca)},
        "mtls-no-hostname-check": {"security_protocol": "SSL", "ssl_check_hostname": False, **mtls},
        "sasl-plain": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", **sasl},
        "sasl-ssl-scram-256": {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "ssl_cafile": str(tls.ca),
            **sasl,
        },
        "sasl-ssl-scram-512-mtls": {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", **sasl, **mtls},
    }


CASES = [
    "plaintext",
    "ssl-system-ca",
    "ssl-ca",
    "mtls-no-hostname-check",
    "sasl-plain",
    "sasl-ssl-scram-256",
    "sasl-ssl-scram-512-mtls",
]


def kafka(tls: TlsFiles, case: str, **extra: Any) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers="broker-a:9093,broker-b:9093", **security_cases(tls)[case], **extra)


@pytest.mark.parametrize("case", CASES)
def test_both_clients_get_the_same_security(tls: TlsFiles, case: str) -> None:
    k = kafka(tls, case)
    py = kafka_python_config(k)
    rd = librdkafka_config(k)
    assert py["bootstrap_servers"] == ["broker-a:9093", "broker-b:9093"]
    assert rd["bootstrap.servers"] == "broker-a:9093,broker-b:9093"
    for py_key, rd_key in SAME.items():
        assert py.get(py_key) == rd.get(rd_key), (py_key, rd_key)
    tls_on = k.security_protocol.endswith("SSL")
    assert ("ssl_check_hostname" in py) == tls_on
    if tls_on:
        assert py["ssl_check_hostname"] is k.ssl_check_hostname
        assert rd["ssl.endpoint.identification.algorithm"] == ("https" if k.ssl_check_hostname else "none")
        assert rd["enable.ssl.certificate.verification"] is True
    else:
        assert not any(key.startswith("ssl") for key in rd)
    # every setting given reached both configs
    given = security_cases(tls)[case]
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if key in given:
            assert py[key] == given[key] == rd[SAME[key]]
    if "sasl_mechanism" in given:
        assert py["sasl_mechanism"] == given["sasl_mechanism"] == rd["sasl.mechanisms"]


def test_sizes_and_crcs_follow_one_setting() -> None:
    k = KafkaSettings(max_message_bytes=3_000_000)
    assert kafka_python_config(k, role="producer")["max_request_size"] == 3_000_000
    consumer = kafka_python_config(k, role="consumer")
    assert consumer["check_crcs"] is True
    assert consumer["max_partition_fetch_bytes"] >= 3_000_000 and consumer["fetch_max_bytes"] >= 3_000_000
    rd = librdkafka_config(k, role="consumer")
    assert rd["check.crcs"] is True and rd["message.max.bytes"] == 3_000_000
    assert rd["fetch.max.bytes"] >= 3_000_000 and rd["max.partition.fetch.bytes"] >= 3_000_000
    assert rd["receive.message.max.bytes"] >= rd["fetch.max.bytes"] + 512  # librdkafka's own rule
    assert librdkafka_config(k, role="producer")["message.max.bytes"] == 3_000_000
    assert k.topic_configs()["max.message.bytes"] == "3000000"
    assert "max_request_size" not in kafka_python_config(k) and "check_crcs" not in kafka_python_config(
        k, role="producer"
    )
    big = KafkaSettings(max_message_bytes=200 << 20)
    assert librdkafka_config(big, role="consumer")["fetch.max.bytes"] >= 200 << 20
    assert kafka_python_config(KafkaSettings(check_crcs=False), role="consumer")["check_crcs"] is False


def test_defaults_fit_the_collectors_largest_body() -> None:
    s = load_settings(environ={}, discover=False)
    assert s.kafka.max_message_bytes > s.collector.max_body_bytes  # stock Kafka's ~1 MB would not
    assert s.kafka.replication_factor == 1 and s.kafka.check_crcs
    assert s.kafka.topic_configs() == {
        "max.message.bytes": str(s.kafka.max_message_bytes),
        "cleanup.policy": "delete",
        "retention.ms": "-1",
    }
    assert KafkaSettings(replication_factor=3).topic_configs()["min.insync.replicas"] == "2"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "sasl_password"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "u"}, "sasl_mechanism"),
        ({"sasl_mechanism": "PLAIN"}, "SASL"),
        ({"ssl_cafile": "/etc/ca.pem"}, "ssl_cafile"),
        ({"security_protocol": "SSL", "ssl_certfile": "/c.pem"}, "ssl_keyfile"),
        ({"replication_factor": 0}, "replication_factor"),
        ({"max_message_bytes": 100}, "max_message_bytes"),
    ],
)
def test_inconsistent_security_is_a_config_error(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ={}, overrides={"kafka": values}, discover=False)
    assert needle in str(err.value) and "kafka" in str(err.value)


def test_a_missing_tls_file_is_named(tmp_path: Path) -> None:
    k = KafkaSettings(security_protocol="SSL", ssl_cafile=str(tmp_path / "nope.pem"))
    for build in (kafka_python_config, librdkafka_config):
        with pytest.raises(ConfigError, match=r"kafka\.ssl_cafile: .*nope\.pem is not a file"):
            build(k)


@pytest.mark.parametrize("case", CASES)
def test_real_clients_accept_the_configs(tls: TlsFiles, case: str) -> None:
    """kafka-python's and librdkafka's constructors refuse unknown keys; librdkafka loads the files."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaConsumer, KafkaProducer

    k = kafka(tls, case)
    pinned = {"api_version": (2, 8)}  # no broker to ask: construction must not connect
    producer = KafkaProducer(**kafka_python_config(k, role="producer"), **pinned)
    consumer = KafkaConsumer(**kafka_python_config(k, role="consumer"), **pinned)
    try:
        assert producer.config["max_request_size"] == k.max_message_bytes
        assert consumer.config["check_crcs"] is True
        assert producer.config["security_protocol"] == consumer.config["security_protocol"] == k.security_protocol
        assert producer.config["ssl_cafile"] == consumer.config["ssl_cafile"] == k.ssl_cafile
        assert producer.config["sasl_plain_password"] == k.sasl_password
    finally:
        producer.close(timeout=0)
        consumer.close()
    Producer(librdkafka_config(k, role="producer"))
    Consumer({**librdkafka_config(k, role="consumer"), "group.id": "t"}).close()
    AdminClient(librdkafka_config(k, role="admin"))


def test_librdkafka_reads_the_files_it_is_given(tls: TlsFiles, tmp_path: Path) -> None:
    """A file that is not a certificate fails at construction: proof that the path reached librdkafka."""
    from confluent_kafka import Consumer, KafkaException

    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    for key, location in (("ssl_cafile", "ssl.ca.location"), ("ssl_keyfile", "ssl.key.location")):
        k = kafka(tls, "mtls-no-hostname-check").model_copy(update={key: str(bad)})
        with pytest.raises(KafkaException, match=location):
            Consumer({**librdkafka_config(k), "group.id": "t"})
    wrong_password = kafka(tls, "mtls-no-hostname-check").model_copy(update={"ssl_key_password": "wrong"})
    with pytest.raises(KafkaException, match="ssl.key.location"):
        Consumer({**librdkafka_config(wrong_password), "group.id": "t"})


def test_every_construction_site_uses_the_settings(
    tls: TlsFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector's and gateway's producers, Dagster's Kafka resource and ingestion's fetcher,
    built from SASL_SSL settings with a client certificate."""
    from confluent_kafka import KafkaException, Producer

    from collectors.gateway.serve import GatewayServer
    from collectors.receivers import CollectorServer
    from pipelines.bronze.fetch import fetch_config, make_fetcher
    from pipelines.defs.resources import resources_from_settings

    s: Settings = load_settings(
        environ={},
        discover=False,
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "kafka": {**security_cases(tls)["sasl-ssl-scram-512-mtls"], "bootstrap_servers": "broker-a:9093"},
        },
    )
    k = s.kafka
    security = {key: v for key, v in librdkafka_config(k, role="producer").items() if key != "bootstrap.servers"}
    for sink in (CollectorServer(s).sink, GatewayServer(s).sink):
        cfg = sink.producer_config  # type: ignore[attr-defined]
        assert {key: cfg[key] for key in security} == security
        assert cfg["message.max.bytes"] == k.max_message_bytes
        assert cfg["batch.size"] <= k.max_message_bytes
        Producer(cfg)  # librdkafka takes the whole config
    # Dagster's resource carries the whole section but the passwords, which it reads from the environment
    resource = resources_from_settings(s)["kafka"]
    assert "s3cret" not in resource.options_json and KEY_PASSWORD not in resource.options_json
    monkeypatch.setenv("AGENTLAKE_KAFKA__SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("AGENTLAKE_KAFKA__SSL_KEY_PASSWORD", KEY_PASSWORD)
    assert resource.settings() == k
    fetch = fetch_config(resource.settings())
    for key, value in librdkafka_config(k, role="consumer").items():
        if key.endswith(".bytes"):  # ingestion may fetch more at once, never less
            assert fetch[key] >= value, key
        else:
            assert fetch[key] == value, key
    make_fetcher(k).close()  # librdkafka loaded the CA, the client certificate and its encrypted key
    with pytest.raises(KafkaException, match="ssl.key.location"):
        make_fetcher(k.model_copy(update={"ssl_key_password": "wrong"}))
