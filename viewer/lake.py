"""Read-only DuckDB over the lake, for the viewer's queries.

The same views ``agentlake query`` uses (pipelines.lake.query.connect: one per table, credit variants
included, missing tables empty), so the viewer reads the lake exactly as the CLI does. Each query runs
on its own cursor (DuckDB cursors share one database and are safe across the server's threads); the
views are rebuilt every ``refresh_s`` so tables and variants written after start are seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import duckdb
import polars as pl

from pipelines.lake.query import connect
from schemas.lake import Lake
from schemas.tables import TABLES

Params = Sequence[Any] | Mapping[str, Any]
T = TypeVar("T")


class ViewerLake:
    """The lake, as DuckDB views; ``frame`` runs one parameterized SELECT and returns Polars."""

    def __init__(self, lake: Lake, *, refresh_s: float = 10.0) -> None:
        self.lake = lake
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._opened = 0.0
        self._tables: frozenset[str] = frozenset()
        self._cache: dict[Hashable, tuple[float, Any]] = {}

    def _connection(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._con is None or time.monotonic() - self._opened > self.refresh_s:
                # The old connection is dropped, not closed: a query on another thread may still run on a
                # cursor of it; DuckDB closes it when the last cursor goes.
                self._con = _shareable(connect(self.lake))
                self._opened = time.monotonic()
                rows = self._con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
                self._tables = frozenset(r[0] for r in rows)
            return self._con

    def tables(self) -> frozenset[str]:
        """The views that can be queried (every table of schemas.tables, plus the built credit variants)."""
        self._connection()
        return self._tables

    def variants(self) -> list[str]:
        """The credit variants built in this lake (the ``<name>`` of ``transitions__<name>``), sorted."""
        prefix = "transitions__"
        return sorted(t[len(prefix) :] for t in self.tables() if t.startswith(prefix) and t != prefix)

    def frame(self, sql: str, params: Params | None = None) -> pl.DataFrame:
        """Run ``sql`` with DuckDB parameters (``?`` with a list, ``$name`` with a dict); values never go
        into the SQL text. Table names come from the fixed views (``TABLES``, ``variants()``)."""
        cur = self._connection().cursor()
        try:
            return cur.execute(sql, params if params is not None else []).pl()
        finally:
            cur.close()

    def cached(self, key: Hashable, compute: Callable[[], T], *, ttl_s: float = 60.0) -> T:
        """``compute()``'s value, kept ``ttl_s`` under ``key``: for whole-table summaries (the filter form's
        choices) that a page would otherwise recompute on every request of a large lake."""
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < ttl_s:
            return hit[1]
        value = compute()
        self._cache[key] = (now, value)
        return value

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


def _shareable(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """``connect`` reads a missing table as a view over a registered empty Arrow table, which only that
    connection sees; copy each into the database (as an empty table) so every cursor can read it."""
    rows = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND sql LIKE '%_empty%'").fetchall()
    for (name,) in rows:
        if name in TABLES:  # the fixed table names only
            con.execute(f"CREATE OR REPLACE TABLE _{name}_none AS SELECT * FROM {name}")
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _{name}_none")
    return con


def known_table(name: str, lake: ViewerLake) -> str:
    """``name`` when it is one of the lake's tables or built variants (an allow-list for table names in SQL)."""
    if name in TABLES or name in lake.tables():
        return name
    raise KeyError(f"not a lake table: {name!r}")
