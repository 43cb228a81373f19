"""`pip install agentlake` alone gives a working agent SDK, without torch, Dagster or DuckDB.

A fresh virtual environment gets the package built from this checkout with its base dependencies
only (pip's cache makes the downloads cheap after the first run). Spans from ``agentlake.init``'s
own OTLP/HTTP exporter reach a small HTTP server here; the `agentlake` command names the extra to
install instead of failing with a traceback.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch",
    "dagster",
    "duckdb",
    "deltalake",
    "polars",
    "pyarrow",
    "kafka",
    "confluent_kafka",
    "transformers",
    "typer",
)

AGENT = """
import importlib.util, sys
import agentlake

endpoint = sys.argv[1]
provider = agentlake.init(endpoint, agent_name="light", batch=False, set_global=False)
with agentlake.rollout(task_id="t1"):
    agentlake.emit_reward(1.0)
provider.shutdown()
print("from:", agentlake.__file__)
print("heavy:", ",".join(m for m in sys.argv[2:] if importlib.util.find_spec(m) is not None))
"""


def _copy_source(dest: Path) -> Path:
    """The files a wheel is built from: pyproject, README and the packages it includes."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    for entry in REPO.iterdir():
        if entry.is_dir() and any(fnmatch(entry.name, p) for p in patterns):
            shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _fresh_install(tmp_path: Path, extras: str = "") -> tuple[Path, dict[str, str]]:
    """A new venv holding the package built from a copy of this checkout (``extras`` e.g. "[serving]"), and the
    environment to run it in (its own, with none of this process's paths)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    source = _copy_source(tmp_path / "src")
    install = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            f"{source}{extras}",
        ],
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv, env


class _Traces(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/traces":
            _Traces.received.append(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def otlp_endpoint() -> Iterator[str]:
    _Traces.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Traces)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(900)
def test_base_install_runs_init_without_the_stack(tmp_path: Path, otlp_endpoint: str) -> None:
    venv, env = _fresh_install(tmp_path)
    python = venv / "bin" / "python"

    agent = subprocess.run(
        [str(python), "-c", AGENT, otlp_endpoint, *HEAVY],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert f"from: {venv}" in agent.stdout, agent.stdout  # the installed copy, not the checkout
    assert agent.stdout.strip().endswith("heavy:"), agent.stdout  # none of them installed
    assert _Traces.received, "the OTLP/HTTP exporter sent nothing"
    assert any(b"agentlake.reward" in body for body in _Traces.received)

    cli = subprocess.run(
        [str(venv / "bin" / "agentlake"), "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert cli.returncode == 3, cli.stdout + cli.stderr
    assert "pip install 'agentlake[stack]'" in cli.stderr
    assert "Traceback" not in cli.stderr


LOADER = """
import importlib.util, json, sys
from pathlib import Path

from schemas.config import load_settings
from serving.loader import Loader

tmp, url, command = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
settings = load_settings(environ={}, discover=False, overrides={
    "state": {"dir": str(tmp / "state")}, "lake": {"root": str(tmp / "lake")}, "model": {"cache_dir": str(tmp / "m")}})
ack = Loader.from_settings(settings, replica="r1", vllm_url=url).handle(command)
absent = ("torch", "transformers", "peft", "dagster", "duckdb", "deltalake", "polars")
installed = [m for m in absent if importlib.util.find_spec(m) is not None]
print(json.dumps({"ack": ack, "installed": installed}, default=str))
"""


@pytest.mark.timeout(900)
def test_serving_extra_runs_a_replicas_loader_without_torch(tmp_path: Path) -> None:
    """`pip install 'agentlake[serving]'` on a replica host: `agentlake loader` is there, and a loader carries out
    a release (fetch, verify, hot-load into a stand-in vLLM) with no torch, Dagster or lake engine installed."""
    from schemas.config import load_settings
    from schemas.lake import Lake
    from serving.releases import release_command
    from tests.serving.helpers import register_stored, running_fake_vllm
    from trainer.registry import Registry

    venv, env = _fresh_install(tmp_path, "[serving]")
    cli = subprocess.run(
        [str(venv / "bin" / "agentlake"), "loader", "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert cli.returncode == 0 and "--replica" in cli.stdout, cli.stdout + cli.stderr

    # The version is stored and registered from this (full) environment, as the trainer would.
    adapter = tmp_path / "lake" / "models" / "v0001"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    settings = load_settings(
        environ={},
        discover=False,
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "lake": {"root": str(tmp_path / "lake")},
            "model": {"cache_dir": str(tmp_path / "m")},
        },
    )
    registry = Registry(Lake.from_settings(settings))
    row = registry.get(register_stored(registry, adapter, 1))
    command = release_command(row, served_name="agentlake-policy", targets=["r1"])
    with running_fake_vllm() as vllm:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", LOADER, str(tmp_path), vllm.url, json.dumps(command, default=str)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
        loads = vllm.loads()
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["installed"] == [], out
    assert [Path(p).name for p in loads] == ["v0001"], loads  # fetched, verified against its hash, hot-loaded
    assert out["ack"]["replica"] == "r1" and out["ack"]["version"] == "v0001", out
