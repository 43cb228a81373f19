"""A round's run read back from a real MLflow tracking server (`mlflow server`, SQLite backend, local artifacts):
the tracker the settings choose (tracking.uri), the parameters, every step's metrics as the loop computed them,
the version tags, the run's link in model_versions, and eval scores added after the round."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentlake.stack.ports import free_port
from schemas.config import load_settings
from schemas.lake import Lake
from tests.trainer.test_trackers import STEP_KEYS, write_round
from trainer.registry import Registry
from trainer.round import train_once
from trainer.trackers import log_eval

pytestmark = pytest.mark.slow  # the server's first start (its migrations) takes 10-60 s here

START_S = 240


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` on a free port for this module; its URL."""
    home = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}"]
    argv += ["--artifacts-destination", str(home / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workers", "1"]
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed after the server
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((home / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker, started in their own session
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_a_rounds_metrics_read_back_from_mlflow(
    mlflow_server: str, lake: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    write_round(lake, zero=2)
    settings = load_settings(
        environ={"AGENTLAKE_STATE_DIR": str(tmp_path / "state")},
        overrides={
            "lake": {"root": str(lake)},
            "trainer": {"min_new_transitions": 1, "lora_rank": 4, "batch_size": 2, "epochs": 2},
            "tracking": {"uri": mlflow_server, "experiment": "rounds"},  # tracker "auto": mlflow, as a uri is known
        },
        discover=False,
    )
    result = train_once(settings, base_model=str(tiny_model_dir), checkpoint_dir=str(lake / "models"), progress=False)

    assert result.version == "v0001" and result.tracking_url
    assert result.tracking_url.startswith(f"{mlflow_server}/#/experiments/")
    row = Registry(Lake(str(lake))).get("v0001")
    assert row["tracking_url"] == result.tracking_url
    run_id = result.tracking_url.rsplit("/runs/", 1)[1]
    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "v0001"
    assert client.get_experiment(run.info.experiment_id).name == "rounds"
    params, tags = run.data.params, run.data.tags
    assert params["algorithm"] == "grpo" and params["lora_rank"] == "4" and params["n_trained"] == "4"
    assert params["table_version_end"] == "0" and params["version"] == "v0001"
    assert tags["version"] == "v0001" and tags["parent_version"] == "none"  # the base model's child
    assert STEP_KEYS <= set(run.data.metrics)
    for key in ("loss", "entropy", "kl", "clip_frac", "grad_norm", "zero_adv_frac", "reward_mean", "adv_std"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert history == [(int(h["step"]), pytest.approx(h[key], rel=1e-6, abs=1e-9)) for h in result.history]
    assert [m.value for m in client.get_metric_history(run_id, "zero_adv_frac")] != [0.0] * 4
    assert json.loads(str(row["metrics"]))["final_entropy"] == pytest.approx(run.data.metrics["entropy"])

    assert log_eval(result.tracking_url, {"mean": 0.75, "n": 32})  # the gate's scores, after the round
    assert client.get_run(run_id).data.metrics["eval_mean"] == 0.75
    assert not log_eval(None, {"mean": 1.0}) and not log_eval("file:///tmp/tb", {"mean": 1.0})
