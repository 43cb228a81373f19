"""The Kafka record as decoding sees it: bytes plus where they came from, no client library."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class KafkaRecord(NamedTuple):
    """One Kafka record as ingestion sees it; decoupled from any client library.

    A named tuple: batches of records are pickled to decoder processes, and tuples pickle cheaply.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    timestamp_ms: int | None = None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v.decode("utf-8", "replace") if v is not None else None
        return None
