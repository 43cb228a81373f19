"""`agentlake gateway pause | resume | state` against a real gateway process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentlake.stack.ports import free_port
from schemas.config import KafkaSettings


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlake", "gateway", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow  # a gateway process and three CLI processes: ~10 s
def test_pause_resume_state(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLAKE_")}
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),  # the gateway's spill folder is its own
        AGENTLAKE_GATEWAY__PORT=str(port),
        KAFKA_BOOTSTRAP_SERVERS=kafka_settings.bootstrap_servers,
        AGENTLAKE_GATEWAY__UPSTREAMS=f'["http://127.0.0.1:{free_port()}"]',
        COLUMNS="200",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors.gateway"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120  # a process start takes seconds, and a minute on a machine at load 25
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "the gateway never answered /health"
                time.sleep(0.2)
        paused = _cli(env, "pause", "--wait", "1")
        assert paused.returncode == 0, paused.stdout + paused.stderr
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 429 and "retry-after" in r.headers
        state = _cli(env, "state").stdout
        assert "True" in state and "spill" in state
        resumed = _cli(env, "resume")
        assert resumed.returncode == 0 and "False" in resumed.stdout
    finally:
        proc.terminate()
        proc.wait(10)
    down = _cli(env, "state")
    assert down.returncode == 1 and "does not answer" in down.stderr
