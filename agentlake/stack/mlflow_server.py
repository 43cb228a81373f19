"""The local stack's MLflow tracking server: each training round's run, its UI at ``tracking.port``.

``mlflow server`` keeps runs in a database of its own (``agentlake_mlflow``) on the stack's local
PostgreSQL (``agentlake.stack.postgres``, started here if Dagster did not) and artifacts in the object
store's ``agentlake-mlflow`` bucket (SeaweedFS's S3 gateway, through ``MLFLOW_S3_ENDPOINT_URL`` and the
store's keys), served through the server (``--serve-artifacts``), so clients need no S3 keys. Without
PostgreSQL it falls back to SQLite under ``<state>/mlflow`` with a warning, as Dagster falls back to its
dev profile; without `weed`, artifacts go in a folder there. The database password reaches the server as
``PGPASSWORD`` in its environment, never on its command line (which the process log records).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from agentlake.stack import objectstore, postgres
from agentlake.stack.dagster import SQLALCHEMY_SCHEME
from agentlake.stack.ports import preferred_or_free
from schemas.config import Settings

PART = "mlflow"
DATABASE = "agentlake_mlflow"
BUCKET = "agentlake-mlflow"
FOLDER = "mlflow"  # under the state folder: the SQLite fallback and the artifact folder fallback
NO_POSTGRES_WARNING = (
    "MLflow's server keeps its runs in PostgreSQL (apt-get install postgresql): using SQLite in {path} instead"
)
NOT_INSTALLED_WARNING = (
    "the `mlflow` package is missing (pip install 'agentlake[stack]'): no MLflow server, and training rounds "
    "are tracked nowhere (tracking.tracker = auto); set tracking.server = false to silence this"
)
NO_WEED_WARNING = "MLflow's artifacts belong in the object store, but `weed` is missing: using the folder {path}"


@dataclass(frozen=True)
class Plan:
    """How the server is started: its command line, environment, and what its status row says."""

    argv: list[str]
    url: str
    backend: str  # without the password
    artifacts: str
    env: dict[str, str] = field(default_factory=dict, repr=False)
    warnings: list[str] = field(default_factory=list)


def folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def ensure_database(conn: postgres.Connection, name: str = DATABASE) -> None:
    """Create the database ``name`` on ``conn``'s server unless it exists (MLflow migrates it on start)."""
    import psycopg2
    from psycopg2 import sql

    db = psycopg2.connect(
        host=conn.host, port=conn.port, user=conn.user, password=conn.password, dbname="postgres", connect_timeout=5
    )
    try:
        db.autocommit = True  # CREATE DATABASE cannot run in a transaction
        with db.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    finally:
        db.close()


def choose_port(settings: Settings) -> tuple[int, str]:
    """(port, warning): ``tracking.port`` while free, else a free one with a warning (0: a free one, quietly).

    Why not fail: the address is recorded in the stack file, where the trainer finds it either way."""
    return preferred_or_free(settings.tracking.port, settings.tracking.host, "MLflow (tracking.port)")


def plan(
    settings: Settings, state_dir: Path, *, conn: postgres.Connection | None, s3_endpoint: str | None, port: int
) -> Plan:
    """The server's command line for this stack: ``conn`` None means SQLite, ``s3_endpoint`` None a folder."""
    t = settings.tracking
    home = folder(state_dir)
    home.mkdir(parents=True, exist_ok=True)
    env = {"MLFLOW_DISABLE_TELEMETRY": "true"}
    warnings: list[str] = []
    if conn is not None:
        backend = f"{SQLALCHEMY_SCHEME}://{conn.user}@{conn.host}:{conn.port}/{DATABASE}"
        shown = f"postgresql://{conn.user}@{conn.host}:{conn.port}/{DATABASE}"
        env["PGPASSWORD"] = conn.password
    else:
        db = home / "mlflow.db"
        backend = shown = f"sqlite:///{db}"
        warnings.append(NO_POSTGRES_WARNING.format(path=db))
    if s3_endpoint is not None:
        artifacts = f"s3://{BUCKET}/"
        keys = objectstore.lake_storage_options(s3_endpoint)
        env.update(
            MLFLOW_S3_ENDPOINT_URL=s3_endpoint,
            AWS_ACCESS_KEY_ID=keys["AWS_ACCESS_KEY_ID"],
            AWS_SECRET_ACCESS_KEY=keys["AWS_SECRET_ACCESS_KEY"],
            AWS_DEFAULT_REGION=keys["AWS_REGION"],
        )
    else:
        artifacts = str(home / "artifacts")
        warnings.append(NO_WEED_WARNING.format(path=artifacts))
    argv = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend,
        "--artifacts-destination",
        artifacts,
        "--serve-artifacts",
        "--host",
        t.host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    return Plan(argv, f"http://{t.host}:{port}", shown, artifacts, env, warnings)
