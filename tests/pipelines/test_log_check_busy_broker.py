"""The slow log check (``check_log``) against a broker that is silent for a while, on a deep partition.

Found by `bench_pipelines.py --grow 30`: a run onto a lake of 290,000 rollouts stopped with "the broker
returned neither that record nor the end of the log within 5s" (nothing written). The broker sent nothing
for the watermark's record within the first probe's second, and the check then read the partition from
its beginning, which cannot reach a watermark 72,000 records deep in 5 s. A silent partition whose end
the broker reports past the watermark holds the record: it is now read there, with the whole wait.

The silence is caused for real: the broker process is stopped (SIGSTOP) and resumed, as a broker busy with
other clients or a long pause is to its clients.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer, TopicPartition

from agentlake.stack.broker import LocalBroker
from pipelines.bronze.decoding import KafkaRecord
from pipelines.bronze.fetch import make_fetcher
from pipelines.bronze.log_reset import check_log, log_ends
from pipelines.bronze.positions import Position, record_fingerprint
from tests.topics import fresh_kafka

pytestmark = pytest.mark.kafka

RECORDS = 200_000  # 400 MB: more than a broker sends in the check's wait from the partition's beginning
VALUE = bytes(2000)


def _fill(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic, VALUE, str(i).encode(), partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _record_at(consumer: object, topic: str, offset: int) -> KafkaRecord:
    consumer.assign([TopicPartition(topic, 0, offset)])  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for m in consumer.consume(num_messages=1, timeout=0.5):  # type: ignore[attr-defined]
            if m.error() is None:
                consumer.unassign()  # type: ignore[attr-defined]
                ts_type, ts = m.timestamp()
                return KafkaRecord(topic, 0, m.offset(), m.key(), m.value(), m.headers() or (), ts if ts_type else None)
    raise AssertionError(f"no record at offset {offset}")


def test_a_silent_broker_at_a_deep_watermark_gets_the_wait() -> None:
    with LocalBroker() as broker:
        kafka = fresh_kafka(broker.bootstrap, prefix="busy", partitions=1)
        _fill(broker.bootstrap, kafka.spans_topic)
        consumer = make_fetcher(kafka)
        try:
            last = RECORDS - 10_000  # the lake is an increment behind the log
            rec = _record_at(consumer, kafka.spans_topic, last)
            # Tansu's memory engine reports its last record batch's first offset as the end: past the
            # watermark here, as it is when a run finds new records
            assert last < log_ends(consumer, kafka.spans_topic, [0], 5.0)[0] <= RECORDS
            pos = {0: Position(0, last, 0, record_fingerprint(rec))}
            broker.pause()  # silent through the first probe's second
            resume = threading.Timer(1.5, broker.resume)
            resume.start()
            try:
                t0 = time.monotonic()
                assert check_log(consumer, kafka.spans_topic, pos, timeout_s=1.0) == {}
                assert time.monotonic() - t0 < 5.0
            finally:
                resume.join()
            # a different record at the watermark is still a reset, found the same way
            broker.pause()
            resume = threading.Timer(1.5, broker.resume)
            resume.start()
            try:
                wrong = {0: Position(0, last, 0, record_fingerprint(rec) ^ 1)}
                problems = check_log(consumer, kafka.spans_topic, wrong, timeout_s=1.0)
            finally:
                resume.join()
            assert list(problems) == [0]
            assert f"the broker has a different record at offset {last}" in problems[0]
        finally:
            consumer.close()
