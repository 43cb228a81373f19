"""Serving follows the registry across `agentlake down`/`up --vllm` and a killed vLLM (issue 26), on the real stack.

`agentlake up --vllm` (the CLI) starts the broker, the collector, vLLM, the gateway and the loader beside vLLM;
the initial policies (the single one and the ``planner`` line) are published as `make demo` does. A SIGKILLed
vLLM makes the loader hold the gateway's policy names (503 + Retry-After). After `down` and `up --vllm` the fresh
vLLM serves nothing until the loader loads the registry's versions, and `up` returns only after it has. (Two
vLLM starts, not three: a suite-time budget.) `agentlake status` says whether vLLM
serves what the registry publishes: current after each restore, unhealthy when they differ.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agentlake.stack import processes
from agentlake.stack.ports import free_port
from schemas.config import load_settings
from tests.stacks import discard_stack

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
REPO = Path(__file__).resolve().parents[2]
LINES = {"agentlake-policy": "v0001", "agentlake-policy-planner": "v0002"}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlake", *args], env=env, capture_output=True, text=True, timeout=900, cwd=REPO
    )


def _served(vllm_url: str) -> dict[str, str]:
    """Adapter name -> the version folder vLLM loaded it from."""
    models = httpx.get(f"{vllm_url}/v1/models", timeout=10).json()["data"]
    return {m["id"]: Path(m["root"]).name for m in models if m.get("parent")}


def _chat(gateway: str, agent: str | None = None) -> httpx.Response:
    body = {"model": "agentlake-policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"x-agentlake-agent": agent} if agent else {}
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _until(what: str, check: Callable[[], bool], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.5)


def test_serving_is_restored_after_a_vllm_kill_and_down_up(tmp_path: Path) -> None:
    from serving.initial import ensure_initial_policies  # torch loads here

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLAKE_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    vllm_port, gateway_port = free_port(), free_port()
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),
        AGENTLAKE_LAKE=str(tmp_path / "lake"),
        AGENTLAKE_KAFKA__LOCAL_BROKER_STORAGE="memory",  # the registry, not the topic, says what to serve
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(free_port()),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
        AGENTLAKE_GATEWAY__PORT=str(gateway_port),
        AGENTLAKE_VLLM__PORT=str(vllm_port),
        AGENTLAKE_VLLM__VENV=str(REPO / ".venv-vllm"),
        AGENTLAKE_MODEL__CACHE_DIR=str(REPO / ".agentlake" / "models"),
        AGENTLAKE_TRAINER__AGENTS='["planner"]',
        AGENTLAKE_SERVING__RESYNC_S="1",
        AGENTLAKE_TRACKING__SERVER="false",  # speed: the MLflow server has tests of its own
        COLUMNS="250",
    )
    vllm, gateway = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{gateway_port}"
    try:
        up = _cli(env, "up", "--vllm", "--no-dagster")
        assert up.returncode == 0, up.stdout + up.stderr
        assert " loader " in up.stdout, up.stdout  # the default stack runs a loader beside its vLLM
        versions = ensure_initial_policies(load_settings(environ=env))
        assert versions == {None: "v0001", "planner": "v0002"}
        status = _cli(env, "status")
        assert status.returncode == 0 and "vLLM serves v0002; registry: v0002" in status.stdout, status.stdout

        state = tmp_path / "state"
        proc = processes.read(state, "vllm")
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)  # a crash of vLLM (its engine process too): nothing is told
        _until("the gateway holds the policy names", lambda: _chat(gateway).status_code == 503, 60)
        held = _chat(gateway, "planner")
        assert held.status_code == 503 and int(held.headers["retry-after"]) > 0, held.text
        status = _cli(env, "status")  # vLLM is down: it serves none of the registry's versions
        assert status.returncode == 1 and "vLLM does not answer; registry: v0002" in status.stdout, status.stdout

        # down with the dead vLLM, then up: the fresh vLLM holds nothing until the loader loads the registry's
        # versions (the running loader's own resync after a restarted vLLM is tests/serving/test_follow_registry)
        down = _cli(env, "down")
        assert down.returncode == 0 and "loader" in down.stdout, down.stdout + down.stderr
        t0 = time.monotonic()
        up = _cli(env, "up", "--vllm", "--no-dagster")
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"up --vllm after a kill and down, registry's versions restored: {time.monotonic() - t0:.1f}s")
        assert _served(vllm) == LINES  # before `up` returned: no agent saw a 404
        assert _chat(gateway).status_code == 200 and _chat(gateway, "planner").status_code == 200
        status = _cli(env, "status")
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("current") == 2 and "vLLM serves v0001; registry: v0001" in status.stdout
        served = _cli(env, "model", "served")  # one vLLM, no release bus: vLLM next to the registry
        assert served.returncode == 0 and served.stdout.count("current") == 2, served.stdout

        # vLLM serves something else than the registry (no loader to fix it): status turns unhealthy
        assert processes.stop(state, "loader")
        httpx.post(f"{vllm}/v1/unload_lora_adapter", json={"lora_name": "agentlake-policy-planner"}, timeout=30)
        status = _cli(env, "status")
        assert status.returncode == 1, status.stdout
        assert "differs" in status.stdout and "vLLM serves nothing; registry: v0002" in status.stdout
    finally:
        discard_stack(env)
