"""DuckDB over the lake: one view per Delta table, named as the table, via the native delta extension.

The extensions come from their wheels (`duckdb-extension-delta`, `-httpfs` for S3 and GCS, `-azure`),
built for the pinned DuckDB and loaded from their folders, so no network access is needed. Object-store
credentials come from ``lake.storage_options`` (one mapping: ``secret_params``).
Examples (also in pipelines/README.md)::

    agentlake query "SELECT agent_name, avg(reward) FROM transitions GROUP BY 1"
    agentlake query "SELECT day, avg((status = 'finished')::int) AS success FROM trajectories GROUP BY 1 ORDER BY 1"
    agentlake query "SELECT rollout_id, n_llm_calls FROM trajectories ORDER BY n_llm_calls DESC LIMIT 10"

Polars users: ``pl.scan_delta(table_path(lake, "transitions"))``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute is used below

from schemas.lake import Lake, sql_string
from schemas.tables import TABLES, transitions_variant

QUERY_TABLES = tuple(TABLES)  # one view per table of schemas.tables (training_lineage included)


def extension_path(name: str = "delta") -> str:
    """An extension file shipped in its ``duckdb-extension-<name>`` wheel for this DuckDB (no download)."""
    import importlib

    try:
        module = importlib.import_module(f"duckdb_extension_{name}")
    except ImportError as exc:
        raise FileNotFoundError(f"no DuckDB {name} extension: pip install duckdb-extension-{name}") from exc
    root = os.path.join(os.path.dirname(module.__file__ or ""), "extensions")
    path = os.path.join(root, f"v{duckdb.__version__}", f"{name}.duckdb_extension")
    if not os.path.exists(path):
        found = sorted(os.listdir(root)) if os.path.isdir(root) else []
        raise FileNotFoundError(
            f"no {name} extension for DuckDB {duckdb.__version__} (wheel has {found}); "
            f"install duckdb and duckdb-extension-{name} of the same version"
        )
    return path


def table_path(lake: Lake, name: str) -> str:
    return lake.uri(name)


def secret_params(root: str, storage_options: Mapping[str, str]) -> tuple[str, dict[str, str]] | None:
    """The DuckDB secret (its extension and parameters) for a lake's storage options, or None.

    Settings keep credentials once, in delta-rs's spelling; this maps them for S3 (httpfs), GCS
    (httpfs's HMAC keys) and Azure (the azure extension). None for a local lake or when no
    credentials are set (DuckDB then uses its default chain).
    """
    scheme = root.split("://", 1)[0].lower() if "://" in root else ""
    opts = {k.upper(): v for k, v in storage_options.items()}
    params: dict[str, str] = {}

    def take(*pairs: tuple[str, str]) -> None:
        for key, name in pairs:
            if key in opts and name not in params:
                params[name] = opts[key]

    if scheme in ("s3", "s3a", "s3n"):
        take(
            ("AWS_ACCESS_KEY_ID", "KEY_ID"),
            ("AWS_SECRET_ACCESS_KEY", "SECRET"),
            ("AWS_REGION", "REGION"),
            ("AWS_DEFAULT_REGION", "REGION"),
            ("AWS_SESSION_TOKEN", "SESSION_TOKEN"),
        )
        endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT")
        if endpoint:
            params["ENDPOINT"] = endpoint.split("://", 1)[-1].rstrip("/")
            params["USE_SSL"] = "false" if endpoint.startswith("http://") else "true"
            virtual = opts.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() in ("1", "true", "yes")
            params["URL_STYLE"] = "vhost" if virtual else "path"
        return ("S3", params) if params else None
    if scheme in ("gs", "gcs"):
        # DuckDB reads GCS through its S3-compatible API with HMAC keys (GOOGLE_* spellings accepted).
        take(("GOOGLE_HMAC_KEY_ID", "KEY_ID"), ("GOOGLE_HMAC_SECRET", "SECRET"))
        return ("GCS", params) if params else None
    if scheme in ("az", "azure", "abfs", "abfss"):
        if "AZURE_STORAGE_CONNECTION_STRING" in opts:
            params["CONNECTION_STRING"] = opts["AZURE_STORAGE_CONNECTION_STRING"]
        else:
            take(
                ("AZURE_STORAGE_ACCOUNT_NAME", "ACCOUNT_NAME"),
                ("AZURE_STORAGE_ACCOUNT", "ACCOUNT_NAME"),
            )
            key = opts.get("AZURE_STORAGE_ACCOUNT_KEY") or opts.get("AZURE_STORAGE_ACCESS_KEY")
            if key and "ACCOUNT_NAME" in params:
                name = params.pop("ACCOUNT_NAME")
                params["CONNECTION_STRING"] = (
                    f"DefaultEndpointsProtocol=https;AccountName={name};AccountKey={key};EndpointSuffix=core.windows.net"
                )
        return ("AZURE", params) if params else None
    return None


def _secret(con: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Object-store credentials from the lake's storage options (see ``secret_params``)."""
    secret = secret_params(lake.root, lake.storage_options)
    if secret is None:
        return
    kind, params = secret
    con.execute(f"LOAD {sql_string(extension_path('azure' if kind == 'AZURE' else 'httpfs'))}")
    parts = [f"TYPE {kind}"]
    for name, value in params.items():
        parts.append(f"{name} {value}" if name == "USE_SSL" else f"{name} {sql_string(value)}")
    con.execute(f"CREATE OR REPLACE SECRET agentlake_lake ({', '.join(parts)})")


def connect(lake: Lake) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with a view per existing table; missing tables are empty views."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    if "://" in lake.root:
        con.execute(f"LOAD {sql_string(extension_path('httpfs'))}")
    con.execute(f"LOAD {sql_string(extension_path('delta'))}")
    _secret(con, lake)
    for name in QUERY_TABLES:
        if lake.table(name) is not None:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM delta_scan({sql_string(lake.uri(name))})")
        else:
            # a table, not a registered Arrow object: those are invisible to the connection's cursors (the viewer's)
            con.register("_empty_arrow", TABLES[name].empty_table())
            con.execute(f"CREATE TABLE _{name}_empty AS SELECT * FROM _empty_arrow")
            con.unregister("_empty_arrow")
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
    for name in _variant_tables(lake):
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM delta_scan({sql_string(lake.uri(name))})")
    return con


def _variant_tables(lake: Lake) -> list[str]:
    """The credit variants built in ``lake`` (``transitions__<name>``): queryable and listed like the rest."""
    from pipelines.gold.variants import variant_names  # lazy: variants builds on the incremental steps

    return [transitions_variant(n) for n in variant_names(lake)]


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
    for name in (*QUERY_TABLES, *_variant_tables(lake)):
        dt = lake.table(name)
        if dt is None:
            out.append(TableInfo(name, 0, None, 0, lake.uri(name)))
            continue
        actions = pa.table(dt.get_add_actions(flatten=True))
        rows_col = actions.column("num_records") if "num_records" in actions.column_names else None
        rows = int(pa.compute.sum(rows_col).as_py() or 0) if rows_col is not None else 0
        out.append(TableInfo(name, rows, dt.version(), actions.num_rows, lake.uri(name)))
    return out
