"""The one seam between receivers and storage: ``RecordSink.send``.

Receivers call ``await sink.send(records)`` and answer the client only after it returns: it
returns once every record is durably acknowledged, and raises ``SinkError`` (retryable) when that
cannot happen now. ``KafkaSink`` (collectors.kafka_sink) is the real one; ``MemorySink`` keeps
records in a list for tests of decoding and HTTP behaviour that need no broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from collectors.errors import SinkUnavailable
from collectors.records import Record


class RecordSink(Protocol):
    async def send(self, records: Sequence[Record]) -> None:
        """Return when every record is acknowledged; raise ``SinkError`` to make the client retry."""
        ...


class MemorySink:
    """Keeps records in memory; ``down = True`` makes it refuse, like a broker that is away."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.down = False

    async def send(self, records: Sequence[Record]) -> None:
        if self.down:
            raise SinkUnavailable("memory sink is marked down")
        self.records.extend(records)
