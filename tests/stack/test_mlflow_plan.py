"""How the stack's MLflow server is started (agentlake.stack.mlflow_server.plan): on PostgreSQL with the password
in its environment only, artifacts in the object store's bucket; SQLite and a folder, each with a warning,
where PostgreSQL or `weed` is missing; a taken port moves with a warning."""

from __future__ import annotations

import socket
from pathlib import Path

from agentlake.stack import mlflow_server, postgres
from agentlake.stack.ports import free_port
from schemas.config import Settings, load_settings


def _settings(tmp_path: Path, **tracking: object) -> Settings:
    return load_settings(
        environ={"AGENTLAKE_STATE_DIR": str(tmp_path)}, overrides={"tracking": tracking}, discover=False
    )


def test_postgres_and_the_object_store(tmp_path: Path) -> None:
    conn = postgres.Connection("127.0.0.1", 5999, "agentlake", "agentlake_dagster", "s3cret")
    plan = mlflow_server.plan(_settings(tmp_path), tmp_path, conn=conn, s3_endpoint="http://127.0.0.1:8333", port=5123)
    backend = plan.argv[plan.argv.index("--backend-store-uri") + 1]
    assert backend == "postgresql+psycopg2://agentlake@127.0.0.1:5999/agentlake_mlflow"
    assert "s3cret" not in " ".join(plan.argv) and "s3cret" not in repr(plan)  # argv goes to the process log
    assert plan.env["PGPASSWORD"] == "s3cret"
    assert plan.argv[plan.argv.index("--artifacts-destination") + 1] == "s3://agentlake-mlflow/"
    assert plan.env["MLFLOW_S3_ENDPOINT_URL"] == "http://127.0.0.1:8333" and plan.env["AWS_ACCESS_KEY_ID"]
    assert (plan.url, plan.warnings) == ("http://127.0.0.1:5123", [])
    assert plan.backend == "postgresql://agentlake@127.0.0.1:5999/agentlake_mlflow"


def test_without_postgres_or_weed_sqlite_and_a_folder_with_warnings(tmp_path: Path) -> None:
    plan = mlflow_server.plan(_settings(tmp_path), tmp_path, conn=None, s3_endpoint=None, port=5123)
    db = tmp_path / "mlflow" / "mlflow.db"
    assert plan.argv[plan.argv.index("--backend-store-uri") + 1] == f"sqlite:///{db}"
    assert plan.argv[plan.argv.index("--artifacts-destination") + 1] == str(tmp_path / "mlflow" / "artifacts")
    assert "PGPASSWORD" not in plan.env and "MLFLOW_S3_ENDPOINT_URL" not in plan.env
    assert [w.split(":")[0] for w in plan.warnings] == [
        "MLflow's server keeps its runs in PostgreSQL (apt-get install postgresql)",
        "MLflow's artifacts belong in the object store, but `weed` is missing",
    ]


def test_a_taken_port_moves_with_a_warning(tmp_path: Path) -> None:
    port = free_port()
    assert mlflow_server.choose_port(_settings(tmp_path, port=port)) == (port, "")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        moved, warning = mlflow_server.choose_port(_settings(tmp_path, port=port))
    assert moved != port and f"port {port} is taken" in warning and str(moved) in warning
    zero, quiet = mlflow_server.choose_port(_settings(tmp_path, port=0))
    assert zero > 0 and quiet == ""
