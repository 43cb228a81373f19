"""`pip install agentlake` alone gives a working agent SDK, without torch, Dagster or DuckDB.

A fresh virtual environment gets the package built from this checkout with its base dependencies
only (pip's cache makes the downloads cheap after the first run). Spans from ``agentlake.init``'s
own OTLP/HTTP exporter reach a small HTTP server here; the `agentlake` command names the extra to
install instead of failing with a traceback.
"""

from __future__ import annotations

import http.server
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
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # the venv's own, only
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(_copy_source(tmp_path / "src"))],
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

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
