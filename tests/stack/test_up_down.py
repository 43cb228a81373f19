"""`agentlake up / status / down` on the real parts: SeaweedFS, Tansu, the collector, Dagster, the viewer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from agentlake.stack import postgres, processes
from agentlake.stack.objectstore import weed_binary
from agentlake.stack.ports import free_port

pytestmark = pytest.mark.slow


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlake", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLAKE_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),
        AGENTLAKE_LAKE=str(tmp_path / "lake"),
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(free_port()),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
        AGENTLAKE_DAGSTER__PORT=str(free_port()),
        AGENTLAKE_VIEWER__PORT=str(viewer_port := free_port()),
        AGENTLAKE_VLLM__PORT=str(free_port()),  # not another test's vLLM on 8000 (its policy row would fail status)
        COLUMNS="200",
        AGENTLAKE_TRACKING__SERVER="false",  # speed: the MLflow server has tests of its own
    )
    try:
        up = _cli(env, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        status = _cli(env, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        # without `weed` the broker falls back to memory and no object store starts
        # Dagster's default (production) profile: PostgreSQL, the code server, the webserver, the daemon;
        # without PostgreSQL installed, `dagster dev` (the dev profile)
        parts = ("broker", "collector", "postgres", "dagster-code", "dagster", "dagster-daemon", "viewer")
        if postgres.bin_dir() is None:
            parts = ("broker", "collector", "dagster", "viewer")
        if weed_binary():
            parts = ("objectstore", *parts)
        for part in parts:
            line = next(line for line in status.stdout.splitlines() if f" {part} " in line)
            assert "healthy" in line, status.stdout
        # the viewer: its row, its address in stack.json, its pages over the stack's lake
        viewer = f"http://127.0.0.1:{viewer_port}"
        assert viewer in next(line for line in status.stdout.splitlines() if " viewer " in line)
        stack = json.loads((tmp_path / "state/stack.json").read_text())
        assert stack["processes"]["viewer"]["address"] == viewer
        assert stack["settings"]["viewer"] == {"host": "127.0.0.1", "port": viewer_port}
        assert httpx.get(f"{viewer}/rollouts", timeout=10).status_code == 200
        pids = [int(p.read_text().split('"pid": ')[1].split(",")[0]) for p in (tmp_path / "state/run").glob("*.json")]
        family = {p for pid in pids for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]}
        assert len(pids) == len(parts) and len(family) >= len(parts)
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert all(part in down.stdout for part in parts), down.stdout
    assert not processes.wait_exited(list(family), 10), "down must stop every child it started"
    assert not list((tmp_path / "state/run").glob("*.json"))
    if weed_binary():
        assert any((tmp_path / "state/objectstore").iterdir()), "the broker's log stays on disk"
    after = _cli(env, "status")
    assert "not started" in after.stdout


def test_bad_config_is_a_clear_cli_error(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTLAKE_COLLECTOR__HTTP_PORT": "not-a-port", "AGENTLAKE_STATE_DIR": str(tmp_path)}
    result = _cli(env, "status")
    assert result.returncode == 2
    assert "collector.http_port" in result.stderr
    assert "Traceback" not in result.stderr
