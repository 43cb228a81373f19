"""`quarantine` rows: a record ingestion refused, kept whole with the reason, never dropped."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from pipelines.bronze.decoding.kafka_record import KafkaRecord


def quarantine_row(rec: KafkaRecord, error: str) -> dict[str, Any]:
    """A `quarantine` row: the raw record, where it came from and why it was refused."""
    headers = {k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in rec.headers}
    return {
        "kafka_topic": rec.topic,
        "kafka_partition": rec.partition,
        "kafka_offset": rec.offset,
        "key": rec.key,
        "value": rec.value,
        "headers": json.dumps(headers),
        "error": error[:2000],
        "quarantined_at": dt.datetime.now(dt.UTC),
    }
