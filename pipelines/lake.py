"""The lake: where each Delta table lives and the few Delta operations the pipeline needs.

Plain code (no Dagster) so ingestion subprocesses, the CLI and replay share it. Every write that
consumes a source records how far it got as a Delta app transaction in the same commit, which is
what makes reruns exactly-once: the table itself says what it already holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from schemas.tables import PARTITION_COLUMNS, TABLES
from schemas.uris import table_uri


@dataclass(frozen=True)
class Lake:
    """A lake root (local folder or object-store URI) and its storage options."""

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def uri(self, table: str) -> str:
        if table not in TABLES:
            raise KeyError(f"unknown table {table!r}; expected one of {', '.join(TABLES)}")
        return table_uri(self.root, table)  # one spelling per location (schemas.uris)

    def _opts(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None

    def table(self, name: str) -> DeltaTable | None:
        """The Delta table, or None when nothing was written yet."""
        try:
            return DeltaTable(self.uri(name), storage_options=self._opts())
        except TableNotFoundError:
            return None

    def version(self, name: str) -> int | None:
        dt = self.table(name)
        return None if dt is None else dt.version()

    def txn(self, name: str, app_id: str) -> int | None:
        """The source position last committed into ``name`` by ``app_id`` (None: never)."""
        dt = self.table(name)
        return None if dt is None else dt.transaction_version(app_id)

    def txns(self, name: str, app_ids: list[str]) -> dict[str, int | None]:
        dt = self.table(name)
        return {a: (None if dt is None else dt.transaction_version(a)) for a in app_ids}

    def scan(self, name: str) -> pl.LazyFrame | None:
        """A lazy Polars scan (None when the table does not exist yet)."""
        dt = self.table(name)
        if dt is None:
            return None
        return pl.scan_delta(dt)

    def write(
        self,
        name: str,
        data: pa.Table,
        *,
        txns: Mapping[str, int] | None = None,
        mode: str = "append",
        predicate: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> int:
        """Write ``data`` and the source positions ``txns`` in one commit; return the new version."""
        schema = TABLES[name]
        data = data.select(schema.names).cast(schema)
        props = CommitProperties(
            app_transactions=[Transaction(app_id, int(v)) for app_id, v in (txns or {}).items()],
            custom_metadata=dict(metadata) if metadata else None,
        )
        kwargs: dict[str, Any] = {}
        if predicate is not None:
            kwargs["predicate"] = predicate
        write_deltalake(
            self.uri(name),
            data,
            mode=mode,  # type: ignore[arg-type]
            partition_by=PARTITION_COLUMNS[name] or None,
            storage_options=self._opts(),
            commit_properties=props,
            **kwargs,
        )
        dt = self.table(name)
        assert dt is not None
        return dt.version()


def sql_string(value: str) -> str:
    """A SQL string literal; Delta predicates are SQL text, so values are quoted, never pasted."""
    return "'" + value.replace("'", "''") + "'"


def in_list(column: str, values: list[str]) -> str:
    """``column IN ('a', 'b')`` with each value quoted."""
    return f"{column} IN ({', '.join(sql_string(v) for v in values)})"
