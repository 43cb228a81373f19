"""Where the lake is in each Kafka partition, as Delta app transactions in a bronze table.

Each topic-partition is an app id (``kafka:<topic>:<partition>``): the last lake offset written,
committed in the same Delta commit as the rows, so a run starts from ``transaction_version + 1``.
Next to it go a fingerprint of the record at the watermark (``kafka-fp:<topic>:<partition>``),
the number of accepted log resets (``kafka-epoch:<topic>``) and, per reset partition, a base
(``kafka-base:<topic>:<partition>``): records of a new log are stored at Kafka offset + base
(`pipelines.bronze.log_reset`). Every step downstream reads bronze by these watermarks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from pipelines.bronze.decoding.kafka_record import KafkaRecord

Kind = Literal["spans", "rewards"]  # the bronze table (and its topic) a run ingests


def app_id(topic: str, partition: int) -> str:
    """The watermark: the last lake offset of ``partition`` in the table (see the module doc)."""
    return f"kafka:{topic}:{partition}"


def fingerprint_id(topic: str, partition: int) -> str:
    """The fingerprint of the record at the watermark, committed with it."""
    return f"kafka-fp:{topic}:{partition}"


def base_id(topic: str, partition: int) -> str:
    """The lake offset of offset 0 of the partition's current log (absent: 0)."""
    return f"kafka-base:{topic}:{partition}"


def epoch_id(topic: str) -> str:
    """How many log resets of ``topic`` the table has accepted (absent: 0)."""
    return f"kafka-epoch:{topic}"


def record_fingerprint(rec: KafkaRecord) -> int:
    """A 63-bit hash of the record's timestamp, key, value and headers (a valid Delta txn version)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(rec.timestamp_ms).encode())
    for part in (rec.key, rec.value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    for k, v in rec.headers:
        kb = k.encode()
        h.update(len(kb).to_bytes(8, "big") + kb)
        h.update(b"\x00" if v is None else b"\x01" + len(v).to_bytes(8, "big") + v)
    return int.from_bytes(h.digest(), "big") >> 1


@dataclass(frozen=True)
class Position:
    """Where the lake is in one partition: its watermark, the current log's base and fingerprint."""

    partition: int
    watermark: int | None  # last lake offset held (None: nothing yet)
    base: int = 0  # lake offset of Kafka offset 0 in the current log
    fingerprint: int | None = None  # of the record at the watermark (None: a lake from before them)

    @property
    def kafka_start(self) -> int | None:
        """The Kafka offset to read from (None: the log's beginning)."""
        return None if self.watermark is None else max(0, self.watermark + 1 - self.base)

    @property
    def kafka_last(self) -> int | None:
        """The Kafka offset of the record at the watermark, when it is in the current log."""
        if self.watermark is None or self.watermark < self.base:
            return None
        return self.watermark - self.base


def positions(dt: Any, topic: str, parts: list[int]) -> tuple[int, dict[int, Position]]:
    """The topic's epoch and each partition's position, as the Delta snapshot ``dt`` holds them."""
    if dt is None:
        return 0, {p: Position(p, None) for p in parts}
    epoch = dt.transaction_version(epoch_id(topic)) or 0
    return epoch, {
        p: Position(
            p,
            dt.transaction_version(app_id(topic, p)),
            dt.transaction_version(base_id(topic, p)) or 0,
            dt.transaction_version(fingerprint_id(topic, p)),
        )
        for p in parts
    }
