"""`agentlake ui`: serves the viewer over a lake it is pointed at, and refuses a public address without tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from agentlake.cli import app
from agentlake.cli.ui import check_host
from agentlake.stack.ports import free_port
from schemas.config import Settings
from schemas.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLAKE_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    return {**env, "AGENTLAKE_STATE_DIR": str(tmp_path / "state"), "AGENTLAKE_LAKE": str(tmp_path / "lake")}


def test_a_public_host_needs_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    refused = CliRunner().invoke(app, ["ui", "--host", "0.0.0.0", "--port", "0"])
    assert refused.exit_code == 1 and "without a token" in " ".join(refused.output.split())
    with pytest.raises(ConfigError, match="viewer.host"):
        check_host(Settings(), "10.1.2.3")
    check_host(Settings(), "127.0.0.1")
    check_host(Settings(), "localhost")
    tokens = Settings.model_validate({"collector": {"auth_tokens": {"t0k": "acme"}}, "gateway": {"admin_token": "op"}})
    check_host(tokens, "0.0.0.0")  # with tokens every visitor shows one: any address


def test_ui_serves_the_lake_it_is_pointed_at(tmp_path: Path) -> None:
    port = free_port()
    lake = tmp_path / "elsewhere"
    lake.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlake", "ui", "--lake", str(lake), "--port", str(port)],
        env=_env(tmp_path),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/rollouts", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "agentlake ui did not start"
                time.sleep(0.2)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert httpx.get(f"http://127.0.0.1:{port}/static/viewer.css").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/rollouts/no-such-rollout").status_code == 404
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"viewer over {lake}" in out
    assert not any(lake.iterdir()), "the viewer writes nothing"


def test_missing_tables_read_as_empty_through_cursors(tmp_path: Path) -> None:
    """The viewer queries on cursors of one DuckDB connection: a table not written yet is empty there too."""
    from pipelines.lake.query import connect
    from schemas.lake import Lake

    con = connect(Lake(str(tmp_path / "empty")))
    cur = con.cursor()
    try:
        assert cur.execute("SELECT count(*) FROM judgements").fetchone() == (0,)
        assert "reason" in [d[0] for d in cur.execute("SELECT * FROM judgements").description]
    finally:
        cur.close()
        con.close()
