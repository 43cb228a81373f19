"""The health page's ingest lag against a real broker (tests/conftest.py's Tansu): records produced to fresh
topics, a lake whose watermark is behind them, and the page's end offset, watermark and lag per partition;
then a broker that is not there: the page still answers 200, fast, and says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaProducer
from starlette.testclient import TestClient

from pipelines.bronze.decoding import decode_spans
from schemas.config import KafkaSettings, load_settings
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from tests.topics import fresh_kafka
from tests.viewer.lake import SPECS, _record
from viewer.app import create_app
from viewer.queries.health import PartitionPosition, TablePosition
from viewer.queries.ingest_lag import lags


def _app(tmp_path: Path, kafka: KafkaSettings, lake: Lake) -> TestClient:
    settings = load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "kafka": {
                "bootstrap_servers": kafka.bootstrap_servers,
                "spans_topic": kafka.spans_topic,
                "rewards_topic": kafka.rewards_topic,
            },
        },
    )
    return TestClient(create_app(settings, lake))


def _row(html: str, topic: str, partition: int) -> str:
    start = html.index(f'data-topic="{topic}" data-partition="{partition}"')
    return html[start : html.index("</tr>", start)]


def _cells(row: str) -> dict[str, str]:
    out = {}
    for cls in ("end", "watermark", "lag-records"):
        at = row.index(f'num {cls}">') + len(f'num {cls}">')
        out[cls] = row[at : row.index("</td>", at)]
    return out


def test_the_page_shows_each_partitions_lag_behind_the_broker(kafka_bootstrap: str, tmp_path: Path) -> None:
    kafka = fresh_kafka(kafka_bootstrap, prefix="viewer-lag", partitions=2)
    producer = KafkaProducer(**kafka_python_config(kafka, role="producer"))
    # one record a batch: Tansu's end offset is then the real one (it reports the last batch's base + 1)
    for i in range(6):
        producer.send(kafka.spans_topic, b"span %d" % i, partition=0)
        producer.flush()
    producer.send(kafka.spans_topic, b"other", partition=1)
    producer.flush()
    producer.close()
    lake = Lake(str(tmp_path / "lake"))
    recs = [_record(i, s)._replace(topic=kafka.spans_topic) for i, s in enumerate(SPECS[:3])]
    # the lake holds offsets 0..2 of partition 0 and nothing of partition 1
    lake.write("spans", decode_spans(recs)[0], txns={f"kafka:{kafka.spans_topic}:0": 2})
    page = _app(tmp_path, kafka, lake).get("/health")
    assert page.status_code == 200, page.text
    assert "No end offsets" not in page.text
    assert _cells(_row(page.text, kafka.spans_topic, 0)) == {"end": "6", "watermark": "2", "lag-records": "3"}
    assert _cells(_row(page.text, kafka.spans_topic, 1)) == {"end": "1", "watermark": "nothing yet", "lag-records": "1"}
    assert _cells(_row(page.text, kafka.rewards_topic, 0)) == {
        "end": "0",
        "watermark": "nothing yet",
        "lag-records": "0",
    }


def test_a_broker_that_is_down_is_said_and_the_page_stays_fast(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    recs = [_record(i, s)._replace(topic="down.spans") for i, s in enumerate(SPECS[:2])]
    lake.write("spans", decode_spans(recs)[0], txns={"kafka:down.spans:0": 1})
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1", spans_topic="down.spans", rewards_topic="down.rewards")
    client = _app(tmp_path, kafka, lake)
    t0 = time.monotonic()
    page = client.get("/health")
    first = time.monotonic() - t0
    assert page.status_code == 200, page.text
    assert "No end offsets:" in page.text and "127.0.0.1:1" in page.text
    assert _cells(_row(page.text, "down.spans", 0)) == {"end": "", "watermark": "1", "lag-records": "unknown"}
    assert first < 4.0, first  # ~1 s for the broker, the rest the page
    t0 = time.monotonic()
    assert "No end offsets:" in client.get("/health").text
    assert time.monotonic() - t0 < first  # kept 10 s: the broker is not asked again


@pytest.mark.parametrize(
    ("watermark", "base", "end", "lag"),
    [(None, 0, 5, 5), (4, 0, 5, 0), (2, 0, 5, 2), (10, 8, 5, 2), (9, 0, 5, 0), (3, 0, None, None)],
)
def test_lag_is_the_end_offset_minus_the_next_kafka_offset(
    watermark: int | None, base: int, end: int | None, lag: int | None
) -> None:
    """A log reset shifts the lake's offsets by its base (pipelines.bronze.log_reset): lag is in the broker's."""
    pos = [TablePosition("spans", 1, None, [PartitionPosition("spans", "t", 0, watermark, base, 0)])]
    ends = {"t": {0: end}} if end is not None else {}
    (row,) = lags(pos, {"spans": "t"}, ends)
    assert (row.end, row.lag) == (end, lag)
