"""The viewer's skeleton: the app starts over an empty lake, pages render, unknown paths are the 404 page."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from schemas.config import load_settings
from schemas.lake import Lake
from viewer.app import create_app


def test_empty_lake_serves_the_rollouts_page_and_a_404_page(tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"state": {"dir": str(tmp_path / "state")}})
    client = TestClient(create_app(settings, Lake(str(tmp_path / "lake"))))
    page = client.get("/rollouts")
    assert page.status_code == 200 and "<h1>Rollouts</h1>" in page.text
    assert client.get("/static/viewer.css").status_code == 200
    missing = client.get("/no/such/page")
    assert missing.status_code == 404 and "Not found" in missing.text


def test_an_empty_lake_has_no_rollouts_and_every_rollout_is_a_404(tmp_path: Path) -> None:
    """No table written yet: every table reads as empty, nothing fails."""
    settings = load_settings(environ={}, overrides={"state": {"dir": str(tmp_path / "state")}})
    client = TestClient(create_app(settings, Lake(str(tmp_path / "lake"))))
    page = client.get("/rollouts", params={"agent": "x", "q": "y", "sort": "reward"})
    assert page.status_code == 200 and "No rollouts match." in page.text
    assert client.get("/rollouts/r0").status_code == 404
    assert client.get("/", follow_redirects=False).headers["location"] == "/rollouts"
