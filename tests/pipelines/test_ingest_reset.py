"""A Kafka log that went back (broker restarted without its log, topic recreated) is detected, never skipped.

Issue 14, finding 2: offsets restart at 0 while the lake's watermarks stay where they were, and
ingestion read from watermark + 1 onwards: new records gave no rows, with no error. Here a real
Tansu broker with memory storage is restarted (or a topic deleted and recreated): ingestion must
stop with a message, and continue from the new log's first record once the reset is accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner, Result

from agentlake.stack.broker import LocalBroker, ensure_topics
from pipelines.bronze.ingest import ingest
from pipelines.bronze.log_reset import accept_reset
from pipelines.bronze.positions import app_id
from schemas.config import KafkaSettings
from schemas.errors import LogResetError
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, span_record
from tests.topics import fresh_kafka

pytestmark = pytest.mark.kafka

PARTITIONS = 2


def _records(tag: str, n: int) -> tuple[list[dict], int]:
    recs, spans = [], 0
    for i in range(n):
        s = make_spans(Rollout(f"{tag}{i}", task_id="t", calls=[Call(prompt=[1, i], response=[2])], final_reward=1.0))
        spans += len(s)
        recs.append(span_record(s, key=f"{tag}{i}"))
    return recs, spans


def _send(k: KafkaSettings, recs: list[dict]) -> None:
    """Round-robin over the partitions, so every partition's watermark is known to the test."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka_python_config(k), acks="all", linger_ms=5)
    try:
        for i, r in enumerate(recs):
            producer.send(k.spans_topic, key=r["key"], value=r["value"], headers=r["headers"], partition=i % PARTITIONS)
        producer.flush(30)
    finally:
        producer.close()


def _settings(bootstrap: str) -> KafkaSettings:
    return fresh_kafka(bootstrap, prefix="reset", partitions=PARTITIONS)


def _cli(args: list[str], lake: Lake, k: KafkaSettings, tmp_path: Path) -> Result:
    from agentlake.cli import app

    env = {
        "AGENTLAKE_LAKE": lake.root,
        "AGENTLAKE_STATE_DIR": str(tmp_path / "state"),
        "KAFKA_BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "AGENTLAKE_KAFKA__SPANS_TOPIC": k.spans_topic,
        "AGENTLAKE_KAFKA__REWARDS_TOPIC": k.rewards_topic,
    }
    return CliRunner().invoke(app, args, env=env)


def _spans(lake: Lake) -> pl.DataFrame:
    return pl.read_delta(lake.uri("spans"))


def _assert_exactly_once(lake: Lake, k: KafkaSettings, records: int, spans: int) -> None:
    df = _spans(lake)
    assert df.height == spans
    assert df.select(pl.struct("trace_id", "span_id").n_unique()).item() == spans
    origin = ["kafka_partition", "kafka_offset"]
    held = pl.concat([df.select(origin), pl.read_delta(lake.uri("quarantine")).select(origin)]).unique()
    assert held.height == records  # one lake offset per record, across logs
    dt = DeltaTable(lake.uri("spans"))
    for p, hi in held.group_by("kafka_partition").agg(pl.col("kafka_offset").max()).iter_rows():
        assert dt.transaction_version(app_id(k.spans_topic, p)) == hi


def test_restarted_broker_stops_then_continues_after_accept(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    with LocalBroker(log_path=tmp_path / "tansu.log") as broker:
        k = _settings(broker.bootstrap)
        old, old_spans = _records("old", 40)
        old.append({"key": b"junk", "value": b"\x00not protobuf", "headers": []})  # quarantined, at a watermark
        _send(k, old)
        first = ingest(lake, k, "spans", batch_records=16, workers=0)
        assert (first.records, first.rows, first.quarantined) == (41, old_spans, 1)
        # nothing changed: the records at the watermarks (one of them quarantined) read back the same
        assert ingest(lake, k, "spans", workers=0).records == 0

        broker.stop()  # memory storage: the log is gone, offsets restart at 0
        broker.start()
        ensure_topics(k, broker.bootstrap)
        new, new_spans = _records("new", 46)  # more records than the lake holds per partition
        _send(k, new)

        with pytest.raises(LogResetError) as err:
            ingest(lake, k, "spans", workers=0)
        msg = str(err.value)
        assert k.spans_topic in msg and "partition 0" in msg and "partition 1" in msg
        assert "different record" in msg and "agentlake lake accept-reset" in msg
        assert _spans(lake).height == old_spans, "nothing may be written before the reset is accepted"

        out = _cli(["lake", "accept-reset", "--topic", "spans"], lake, k, tmp_path)
        assert out.exit_code == 0, out.output
        assert "accepted epoch 1" in out.output and "partition 1:" in out.output
        assert accept_reset(lake, k, "spans") is None, "an accepted log is not reset again"
        history = [h for h in DeltaTable(lake.uri("spans")).history() if h.get("agentlake.operation")]
        reset = json.loads(history[0]["agentlake.reset"])
        assert reset["epoch"] == 1 and set(reset["partitions"]) == {"0", "1"}

        second = ingest(lake, k, "spans", workers=0)
        assert (second.records, second.rows, second.epoch) == (46, new_spans, 1)
        _assert_exactly_once(lake, k, 41 + 46, old_spans + new_spans)
        assert ingest(lake, k, "spans", workers=0).records == 0

        broker.stop()  # again, now with a log shorter than the lake's
        broker.start()
        ensure_topics(k, broker.bootstrap)
        short, short_spans = _records("short", 4)
        _send(k, short)
        with pytest.raises(LogResetError, match="log ends at offset 1"):
            ingest(lake, k, "spans", workers=0)
        third = ingest(lake, k, "spans", workers=0, on_reset="accept")
        assert (third.records, third.rows, third.epoch) == (4, short_spans, 2)
        _assert_exactly_once(lake, k, 41 + 46 + 4, old_spans + new_spans + short_spans)


def test_recreated_topic_is_detected(kafka_bootstrap: str, tmp_path: Path) -> None:
    from kafka import KafkaAdminClient

    k = _settings(kafka_bootstrap)
    lake = Lake(str(tmp_path / "lake"))
    old, old_spans = _records("a", 10)
    _send(k, old)
    assert ingest(lake, k, "spans", workers=0).rows == old_spans

    admin = KafkaAdminClient(**kafka_python_config(k), request_timeout_ms=10_000)
    try:
        admin.delete_topics([k.spans_topic])
    finally:
        admin.close()
    ensure_topics(k, kafka_bootstrap, [k.spans_topic])
    _send(k, _records("b", 3)[0])
    with pytest.raises(LogResetError, match="ends at offset 1"):
        ingest(lake, k, "spans", workers=0)


def test_watermarks_from_before_fingerprints_are_compared_with_rows(tmp_path: Path) -> None:
    """A lake whose watermarks carry no fingerprint (written before them): the record is compared with its rows."""
    from pipelines.bronze.decoding import KafkaRecord, decode_spans

    lake = Lake(str(tmp_path / "lake"))
    with LocalBroker(log_path=tmp_path / "tansu.log") as broker:
        k = _settings(broker.bootstrap)
        old, _ = _records("old", 6)
        _send(k, old)
        # the lake as the old code left it: rows and watermarks, no fingerprint
        recs = [
            KafkaRecord(k.spans_topic, i % PARTITIONS, i // PARTITIONS, r["key"], r["value"], r["headers"])
            for i, r in enumerate(old)
        ]
        lake.write("spans", decode_spans(recs)[0], txns={app_id(k.spans_topic, p): 2 for p in range(PARTITIONS)})
        assert ingest(lake, k, "spans", workers=0).records == 0  # same log: the rows match

        broker.stop()
        broker.start()
        ensure_topics(k, broker.bootstrap)
        _send(k, _records("new", 8)[0])
        with pytest.raises(LogResetError, match="different record at offset 2"):
            ingest(lake, k, "spans", workers=0)
