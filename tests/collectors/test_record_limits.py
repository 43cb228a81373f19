"""A trace too big for one Kafka record is a clear 413 (gRPC INVALID_ARGUMENT), never a silent loss.

The real collector and the real broker. The check happens before producing, against the smaller
of ``kafka.max_message_bytes`` and the topic's own ``max.message.bytes`` (read from the broker at
connect), so a request is written whole or not at all. Tansu does not enforce ``max.message.bytes``
itself (tests/stack/test_topic_settings.py), so without that check these records would be written;
that is what the tests below would see if the check were missing.
"""

from __future__ import annotations

import os

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.kafka_sink import KafkaSink
from schemas.config import Settings
from schemas.kafka import kafka_python_config
from tests.collectors.helpers import read_topic, running_collector, spans_of

pytestmark = pytest.mark.kafka

SMALL_LIMIT = 64 << 10
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def trace_request(*sizes: int) -> tuple[bytes, list[str]]:
    """One request with one trace per size (two spans each, one attribute of ``size`` bytes); its trace ids."""
    req = ExportTraceServiceRequest()
    scope = req.resource_spans.add().scope_spans.add()
    traces = []
    for size in sizes:
        trace_id = os.urandom(16)
        traces.append(trace_id.hex())
        for name in ("llm", "tool"):
            span = scope.spans.add(
                trace_id=trace_id, span_id=os.urandom(8), name=name, start_time_unix_nano=1_700_000_000_000_000_000
            )
            kv = span.attributes.add(key="payload")
            kv.value.string_value = "x" * (size // 2)
    return req.SerializeToString(), traces


def post(port: int, body: bytes) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/traces",
        content=body,
        headers={"content-type": "application/x-protobuf"},
        timeout=30,
    )


def message(r: httpx.Response) -> str:
    return status_pb2.Status.FromString(r.content).message


def test_a_trace_over_our_limit_refuses_the_whole_request(settings: Settings) -> None:
    settings.kafka.max_message_bytes = SMALL_LIMIT
    body, (small, big) = trace_request(1_000, 100_000)
    with running_collector(settings) as server:
        r = post(server.http_port, body)
        assert r.status_code == 413, r.text
        text = message(r)
        assert f"trace {big}" in text and f"over the limit of {SMALL_LIMIT} bytes" in text
        size = int(text.split("record of ")[1].split(" bytes")[0])
        assert 100_000 < size < 110_000
        assert "nothing of this request was written" in text
        assert server.collector.stats.acknowledged_spans == 0

        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(EXPORT)(body, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # not retried: it can never fit
        assert err.value.details() == text

        ok_body, (alone,) = trace_request(1_000)
        assert post(server.http_port, ok_body).status_code == 200
    records = read_topic(settings.kafka, settings.kafka.spans_topic, expect=1)
    assert {t for t, _ in spans_of(records)} == {alone}  # neither trace of the refused request
    assert small not in {t for t, _ in spans_of(records)}


def test_a_topic_smaller_than_our_limit_is_respected(settings: Settings) -> None:
    """An existing topic that takes less than kafka.max_message_bytes: its limit is read at connect."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    k = settings.kafka
    topic = f"{k.spans_topic}.small"
    admin = KafkaAdminClient(**kafka_python_config(k), request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, 2, 1, topic_configs={"max.message.bytes": "32768"})])
    finally:
        admin.close()
    settings.kafka.spans_topic = topic
    with running_collector(settings) as server:
        assert server.sink.limits[topic] == 32768  # type: ignore[attr-defined]
        big_body, (big,) = trace_request(50_000)
        r = post(server.http_port, big_body)
        assert r.status_code == 413, r.text
        assert f"trace {big}" in message(r) and "over the limit of 32768 bytes" in message(r)
        fits, (small,) = trace_request(20_000)
        assert post(server.http_port, fits).status_code == 200
    assert {t for t, _ in spans_of(read_topic(k, topic, expect=1))} == {small}


def test_a_record_refused_after_sending_is_413_and_the_producer_carries_on(settings: Settings) -> None:
    """Kafka refusing a record as too large (MESSAGE_TOO_LARGE) after our check let it through.

    Tansu never refuses one, so this is caused with a producer whose message.max.bytes (32 KiB) is below
    kafka.max_message_bytes: librdkafka refuses the record with the same MSG_SIZE_TOO_LARGE that a
    broker's refusal gives, after the earlier records of the request were handed to it.
    """
    sink = KafkaSink(settings.kafka, producer_overrides={"message.max.bytes": 32 << 10})
    body, (small, big) = trace_request(1_000, 50_000)
    with running_collector(settings, sink) as server:
        from tests.collectors.helpers import wait_until

        wait_until(lambda: sink.connected, 20, "the producer")
        r = post(server.http_port, body)
        assert r.status_code == 413, r.text
        text = message(r)
        assert f"trace {big}" in text and "refused as too large (MSG_SIZE_TOO_LARGE)" in text
        assert "stay written" in text
        after, (later,) = trace_request(1_000)
        r = post(server.http_port, after)
        assert r.status_code == 200, r.text  # no 503: the producer was not poisoned
        assert sink.replacements == 0
    # the traces Kafka took stay written (said in the 413); the refused one is not there
    assert {t for t, _ in spans_of(read_topic(settings.kafka, settings.kafka.spans_topic, expect=2))} == {
        small,
        later,
    }


def test_the_largest_body_the_collector_takes_fits_one_record_by_default() -> None:
    """Defaults agree: a single trace filling collector.max_body_bytes is one record under kafka.max_message_bytes."""
    from collectors.records import split_traces
    from collectors.topic_limits import record_size
    from schemas.config import load_settings

    s = load_settings(environ={}, discover=False)
    body, (trace,) = trace_request(s.collector.max_body_bytes - 200)
    assert s.collector.max_body_bytes - 1000 < len(body) <= s.collector.max_body_bytes
    split = split_traces(
        ExportTraceServiceRequest.FromString(body),
        tenant="a-long-tenant-name",
        topic="t",
        received_at_ns=1,
        original=body,
    )
    (record,) = split.records
    assert record.key == trace.encode()
    assert len(body) < record_size(record) <= s.kafka.max_message_bytes
