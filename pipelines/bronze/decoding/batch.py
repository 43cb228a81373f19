"""Span records to a `spans` table plus `quarantine` rows: a batch filled record by record.

Nothing here talks to Kafka or Delta: a record is its bytes plus where it came from, so the same code
serves ingestion, replay and tests. A bad record is quarantined whole, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.bronze.decoding.kafka_record import KafkaRecord
from pipelines.bronze.decoding.quarantine import quarantine_row
from pipelines.bronze.decoding.rows import GROUP_COLUMNS, ROW_COLUMNS, ROW_TYPE
from pipelines.bronze.decoding.spans import TokenArrays, decode_request
from pipelines.bronze.decoding.tokens import TOKEN_COLUMNS, token_column
from schemas.gc_pause import gc_paused
from schemas.tables import QUARANTINE, SPANS

_US_PER_DAY = 86_400_000_000


class SpanBatch:
    """`spans` rows (tuples, one per span) plus `quarantine` rows, filled record by record.

    A row holds the span's start and end in nanoseconds (end 0: not ended) and packed token arrays;
    ``to_table`` turns the batch into Arrow column by column, so no per-span work is left there.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.groups: list[tuple[Any, ...]] = []  # GROUP_COLUMNS of each (record, resource)
        self.tokens: list[TokenArrays] = []
        self.records = 0
        self._quarantine: list[tuple[int, dict[str, Any]]] = []
        self._recs: list[KafkaRecord] = []
        self._ranges: list[tuple[int, int]] = []  # rows of each record, for dropping a late-failing one
        self._built: tuple[pa.Table, list[dict[str, Any]]] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rec: KafkaRecord) -> int:
        """Decode one record; on any error quarantine the whole record and return 0."""
        idx = self.records
        self.records += 1
        self._built = None
        self._recs.append(rec)
        try:
            rows, tokens = decode_request(rec, idx, self.groups)
        except Exception as exc:  # noqa: BLE001 - any bad record is quarantined, never fatal
            self._quarantine.append((idx, quarantine_row(rec, f"{type(exc).__name__}: {exc}")))
            self._ranges.append((len(self.rows), len(self.rows)))
            return 0
        n = len(self.rows)
        self.rows.extend(rows)
        self.tokens.extend((n + i, p, c, lp) for i, p, c, lp in tokens)
        self._ranges.append((n, len(self.rows)))
        return len(rows)

    @property
    def quarantine(self) -> list[dict[str, Any]]:
        """Quarantine rows in record order, including records whose token arrays failed at build."""
        return self._build()[1]

    def to_table(self) -> pa.Table:
        return self._build()[0]

    def quarantine_table(self) -> pa.Table:
        return pa.Table.from_pylist(self.quarantine, schema=QUARANTINE)

    def _build(self) -> tuple[pa.Table, list[dict[str, Any]]]:
        if self._built is not None:
            return self._built
        n = len(self.rows)
        rows = pa.array(self.rows, ROW_TYPE)  # tuples to a struct: one C++ pass, no Python transpose
        cols: dict[str, Any] = dict(zip(ROW_COLUMNS, rows.flatten(), strict=True))
        group = cols.pop("group")
        groups = zip(*self.groups, strict=True) if self.groups else ((),) * len(GROUP_COLUMNS)
        for name, values in zip(GROUP_COLUMNS, groups, strict=True):
            typ = SPANS.field(name).type
            arr = pa.array(values, pa.int64()).cast(typ) if name == "received_at" else pa.array(values, typ)
            cols[name] = arr.take(group)
        bad: dict[int, str] = {}
        for column, name in enumerate(TOKEN_COLUMNS, start=1):
            present = [t for t in self.tokens if t[column] is not None]
            cols[name] = token_column(name, n, [t[0] for t in present], [t[column] for t in present], bad)
        start_ns = cols["start_time"].to_numpy(zero_copy_only=False)
        end_ns = cols["end_time"].to_numpy(zero_copy_only=False)
        start_us = (start_ns // 1000).astype(np.int64)
        cols["start_time"] = pa.array(start_us).cast(SPANS.field("start_time").type)
        cols["end_time"] = pa.array((end_ns // 1000).astype(np.int64), mask=end_ns == 0).cast(
            SPANS.field("end_time").type
        )
        cols["day"] = pa.array((start_us // _US_PER_DAY).astype(np.int32)).cast(pa.date32())
        cols["redacted"] = pa.nulls(n, SPANS.field("redacted").type)
        table = pa.Table.from_pydict(cols, schema=SPANS)
        quarantine = list(self._quarantine)
        if bad:
            keep = np.ones(n, bool)
            for idx, err in bad.items():
                lo, hi = self._ranges[idx]
                keep[lo:hi] = False
                quarantine.append((idx, quarantine_row(self._recs[idx], err)))
            table = table.filter(pa.array(keep))
        quarantine.sort(key=lambda q: q[0])
        self._built = (table, [q for _, q in quarantine])
        return self._built


def decode_spans(records: Iterable[KafkaRecord]) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Span records to a `spans` table and the `quarantine` rows of those that could not be decoded."""
    with gc_paused():
        batch = SpanBatch()
        for rec in records:
            batch.add(rec)
        return batch.to_table(), batch.quarantine
