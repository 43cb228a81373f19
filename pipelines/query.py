"""DuckDB over the lake: one view per Delta table, named as the table, via the native delta extension.

The extension comes from the `duckdb-extension-delta` wheel (built for the pinned DuckDB), loaded
from its folder, so no network access is needed. Examples (also in pipelines/README.md)::

    agentlake query "SELECT agent_name, avg(reward) FROM transitions GROUP BY 1"
    agentlake query "SELECT day, avg((status = 'finished')::int) AS success FROM trajectories GROUP BY 1 ORDER BY 1"
    agentlake query "SELECT rollout_id, n_llm_calls FROM trajectories ORDER BY n_llm_calls DESC LIMIT 10"

Polars users: ``pl.scan_delta(table_path(lake, "transitions"))``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute is used below

from pipelines.lake import Lake, sql_string
from schemas.tables import TABLES

QUERY_TABLES = tuple(TABLES)  # one view per table of schemas.tables (training_lineage included)


def extension_path() -> str:
    """The delta extension file shipped in the duckdb-extension-delta wheel for this DuckDB."""
    import duckdb_extension_delta

    root = os.path.join(os.path.dirname(duckdb_extension_delta.__file__), "extensions")
    path = os.path.join(root, f"v{duckdb.__version__}", "delta.duckdb_extension")
    if not os.path.exists(path):
        found = sorted(os.listdir(root)) if os.path.isdir(root) else []
        raise FileNotFoundError(
            f"no delta extension for DuckDB {duckdb.__version__} (wheel has {found}); "
            "install duckdb and duckdb-extension-delta of the same version"
        )
    return path


def table_path(lake: Lake, name: str) -> str:
    return lake.uri(name)


def _secret(con: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Object-store credentials from the lake's storage options, for s3:// roots."""
    opts = {k.upper(): v for k, v in lake.storage_options.items()}
    if not lake.root.startswith(("s3://", "s3a://")) or not opts:
        return
    parts = ["TYPE S3"]
    for key, name in (
        ("AWS_ACCESS_KEY_ID", "KEY_ID"),
        ("AWS_SECRET_ACCESS_KEY", "SECRET"),
        ("AWS_REGION", "REGION"),
        ("AWS_SESSION_TOKEN", "SESSION_TOKEN"),
    ):
        if key in opts:
            parts.append(f"{name} {sql_string(opts[key])}")
    if "AWS_ENDPOINT_URL" in opts:
        endpoint = opts["AWS_ENDPOINT_URL"]
        parts.append(f"ENDPOINT {sql_string(endpoint.split('://', 1)[-1])}")
        parts.append(f"USE_SSL {'true' if endpoint.startswith('https') else 'false'}")
        parts.append("URL_STYLE 'path'")
    con.execute(f"CREATE OR REPLACE SECRET agentlake_lake ({', '.join(parts)})")


def connect(lake: Lake) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with a view per existing table; missing tables are empty views."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD {sql_string(extension_path())}")
    _secret(con, lake)
    for name in QUERY_TABLES:
        if lake.table(name) is not None:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM delta_scan({sql_string(lake.uri(name))})")
        else:
            con.register(f"_{name}_empty", TABLES[name].empty_table())
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
    return con


def run_query(lake: Lake, sql: str) -> pa.Table:
    """Run one SQL statement against the lake's views and return the result as Arrow."""
    con = connect(lake)
    try:
        return con.execute(sql).fetch_arrow_table()
    finally:
        con.close()


@dataclass(frozen=True)
class TableInfo:
    name: str
    rows: int
    version: int | None
    files: int
    path: str


def list_tables(lake: Lake) -> list[TableInfo]:
    """Each table with its row count (from the Delta log's file statistics) and version."""
    out = []
    for name in QUERY_TABLES:
        dt = lake.table(name)
        if dt is None:
            out.append(TableInfo(name, 0, None, 0, lake.uri(name)))
            continue
        actions = pa.table(dt.get_add_actions(flatten=True))
        rows_col = actions.column("num_records") if "num_records" in actions.column_names else None
        rows = int(pa.compute.sum(rows_col).as_py() or 0) if rows_col is not None else 0
        out.append(TableInfo(name, rows, dt.version(), actions.num_rows, lake.uri(name)))
    return out
