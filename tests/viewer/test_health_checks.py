"""The health page's asset checks: the parsing of a response captured from a real dagster-webserver
(dagster_checks_response.json: ``QUERY`` against tests/viewer/checks_defs.py after one materialization),
Dagster not there (the page says so, 200), and a slow test against a real webserver (~5 s to start here)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from schemas.config import load_settings
from schemas.lake import Lake
from viewer.app import create_app
from viewer.queries.asset_checks import QUERY, parse_checks

HERE = Path(__file__).parent
REPO = HERE.parent.parent
CAPTURED = json.loads((HERE / "dagster_checks_response.json").read_text())


def test_the_query_is_valid_against_the_installed_dagster_graphql_schema() -> None:
    from dagster_graphql.schema import create_schema
    from graphql import parse, validate

    assert validate(create_schema().graphql_schema, parse(QUERY)) == []


def test_a_captured_response_parses_to_each_checks_latest_result() -> None:
    got = parse_checks(CAPTURED, "http://dagster:3000")
    assert got.error is None
    warn, passed = got.checks  # the warning first: what needs a look leads
    assert (warn.asset, warn.check, warn.result) == ("lake_rows", "rewards_vary", "warn")
    assert warn.summary == "one distinct reward; distinct: 1; viewer: http://127.0.0.1:8000/health"
    assert warn.link == "http://dagster:3000/assets/lake_rows?view=checks&checkDetail=rewards_vary"
    assert warn.description == "Rewards are not all the same." and warn.when is not None
    assert (passed.check, passed.result, passed.summary) == ("rows_have_tenants", "passed", "rows: 3")


def test_failed_never_run_and_graphql_errors_read_as_such() -> None:
    node = CAPTURED["data"]["assetNodes"][0]
    checks = node["assetChecksOrError"]["checks"]
    failed = json.loads(json.dumps(checks[0]))
    failed["name"] = "x"
    failed["executionForLatestMaterialization"]["evaluation"]["severity"] = "ERROR"
    never = {"name": "y", "description": None, "executionForLatestMaterialization": None}
    payload = {
        "data": {
            "assetNodes": [{**node, "assetChecksOrError": {"__typename": "AssetChecks", "checks": [never, failed]}}]
        }
    }
    got = parse_checks(payload, "http://d")
    assert [(c.check, c.result) for c in got.checks] == [("x", "failed"), ("y", "never run")]
    assert parse_checks({"errors": [{"message": "boom"}]}, "http://d").error == "Dagster answered with errors: boom"


def _client(tmp_path: Path, port: int) -> TestClient:
    settings = load_settings(
        environ={}, overrides={"state": {"dir": str(tmp_path / "state")}, "dagster": {"port": port}}
    )
    return TestClient(create_app(settings, Lake(str(tmp_path / "lake"))))


def test_dagster_not_running_is_said_with_a_link_and_the_page_is_fast(tmp_path: Path) -> None:
    t0 = time.monotonic()
    page = _client(tmp_path, 1).get("/health")
    assert page.status_code == 200, page.text
    assert time.monotonic() - t0 < 4.0
    assert "No check results:" in page.text
    assert "Dagster&#39;s webserver at http://127.0.0.1:1 did not answer" in page.text
    assert 'class="dagster" href="http://127.0.0.1:1/assets"' in page.text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def dagster_webserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real dagster-webserver over tests/viewer/checks_defs.py, its checks run once (in a child process)."""
    home = tmp_path_factory.mktemp("dagster_home")
    (home / "dagster.yaml").write_text("")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    run = (
        "from dagster import DagsterInstance, materialize\n"
        "from tests.viewer.checks_defs import lake_rows, rewards_vary, rows_have_tenants\n"
        "materialize([lake_rows, rows_have_tenants, rewards_vary], instance=DagsterInstance.get())\n"
    )
    subprocess.run([sys.executable, "-c", run], env=env, cwd=REPO, check=True, capture_output=True, timeout=120)
    port = _free_port()
    argv = [str(Path(sys.executable).parent / "dagster-webserver"), "-m", "tests.viewer.checks_defs"]
    log = open(home / "webserver.log", "wb")  # noqa: SIM115 -- open for the process's lifetime
    proc = subprocess.Popen([*argv, "-h", "127.0.0.1", "-p", str(port)], env=env, cwd=REPO, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (home / "webserver.log").read_text()
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_the_page_shows_a_real_webservers_check_results(dagster_webserver: int, tmp_path: Path) -> None:
    client = _client(tmp_path, dagster_webserver)
    page = client.get("/health")
    assert page.status_code == 200, page.text
    assert "No check results" not in page.text
    row = page.text[page.text.index('data-check="lake_rows:rewards_vary"') :]
    row = row[: row.index("</tr>")]
    assert '<td class="result">warn</td>' in row and "one distinct reward; distinct: 1" in row
    link = f"http://127.0.0.1:{dagster_webserver}/assets/lake_rows?view=checks&amp;checkDetail=rewards_vary"
    assert link in row
    assert 'data-check="lake_rows:rows_have_tenants"' in page.text and '<td class="result">passed</td>' in page.text
    # a tenant's token would not see them; anonymous here is the operator. Kept 30 s: a second page asks nobody
    t0 = time.monotonic()
    assert client.get("/health").status_code == 200
    assert time.monotonic() - t0 < 2.0
