"""Read-only DuckDB over the lake, for the viewer's queries.

The same views ``agentlake query`` uses (pipelines.lake.query.connect: one per table, credit variants
included, missing tables empty), so the viewer reads the lake exactly as the CLI does. Each query runs
on its own cursor (DuckDB cursors share one database and are safe across the server's threads); the
views are rebuilt every ``refresh_s`` (in the background) so tables and variants written after start are seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar, cast

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
        self._refreshing = False

    def _connection(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._con is None:
                self._swap(connect(self.lake))
            elif time.monotonic() - self._opened > self.refresh_s and not self._refreshing:
                # rebuilt off the request path (each table's Delta log is read: ~0.2-1 s on a large lake);
                # requests use the current views until the new ones are ready
                self._refreshing = True
                threading.Thread(target=self._refresh, name="viewer-lake-refresh", daemon=True).start()
            assert self._con is not None
            return self._con

    def _refresh(self) -> None:
        try:
            con: duckdb.DuckDBPyConnection | None = connect(self.lake)
        except Exception:  # noqa: BLE001 - the current views stay; the next refresh tries again
            con = None
        with self._lock:
            self._refreshing = False
            if con is not None:
                self._swap(con)
            else:
                self._opened = time.monotonic()

    def _swap(self, con: duckdb.DuckDBPyConnection) -> None:
        """Use ``con``'s views from now on (the caller holds the lock). The old connection is not closed here: a
        query may still run on one of its cursors (closing it fails that query); it goes when its last cursor does."""
        self._con = con
        self._opened = time.monotonic()
        rows = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
        self._tables = frozenset(r[0] for r in rows)

    def cached(self, key: Hashable, compute: Callable[[], T], *, ttl_s: float = 60.0) -> T:
        """``compute()``, kept ``ttl_s`` seconds under ``key``: for summaries of a whole table (the filter form's
        choices) that cost a full scan on a large lake and may well be a minute old."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < ttl_s:
            return cast(T, hit[1])
        value = compute()
        with self._lock:
            self._cache[key] = (now, value)
        return value

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

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


def known_table(name: str, lake: ViewerLake) -> str:
    """``name`` when it is one of the lake's tables or built variants (an allow-list for table names in SQL)."""
    if name in TABLES or name in lake.tables():
        return name
    raise KeyError(f"not a lake table: {name!r}")
