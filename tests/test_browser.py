"""The browser harness itself (tests/browser.py): Debian Chromium opens a localhost page, a link is
clicked and the next page rendered, and screenshots land where the harness says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.browser import Screenshots, chromium_path, serve_app

pytestmark = pytest.mark.browser


async def _home(request: Request) -> HTMLResponse:
    return HTMLResponse('<html><title>home</title><body><a id="go" href="/runs/7">run 7</a></body></html>')


async def _run(request: Request) -> HTMLResponse:
    run = request.path_params["run"]
    # rendered by script, so a page that only fetched the HTML (no JavaScript) would not show it
    return HTMLResponse(
        f'<html><title>run {run}</title><body><h1 id="h"></h1>'
        f"<script>document.getElementById('h').textContent = 'run ' + {int(run)} + ' ok';</script>"
        "</body></html>"
    )


APP = Starlette(routes=[Route("/", _home), Route("/runs/{run}", _run)])


def test_click_a_link_and_screenshot(browser_page: Page, screenshots: Screenshots, tmp_path: Path) -> None:
    with serve_app(APP) as base:
        browser_page.goto(base + "/")
        assert browser_page.title() == "home"
        browser_page.click("#go")
        browser_page.wait_for_url(base + "/runs/7")
        assert browser_page.locator("#h").inner_text() == "run 7 ok"
        shot = screenshots.save(browser_page, "run page")
        elsewhere = screenshots.save(browser_page, "ignored", path=tmp_path / "docs" / "run.png")
    assert shot.name == "run_page.png" and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert elsewhere.is_file() and screenshots.saved == [shot, elsewhere]


def test_chromium_is_the_systems(browser_page: Page) -> None:
    """The harness drives the Chromium scripts/chromium.sh installs, not a browser Playwright downloaded."""
    exe = chromium_path()
    assert exe is not None
    printed = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    browser = browser_page.context.browser
    assert browser is not None and browser.version in printed


def test_later_modules_can_run_an_event_loop(tmp_path: Path) -> None:
    """While Playwright's sync API lives, asyncio sees a running loop in the main thread; the harness stops it
    with each module, so a later module's ``asyncio.run`` works (CI failed two vLLM tests when it did not)."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.browser"]\n')
    (tmp_path / "test_a_browser.py").write_text(
        "def test_page(browser_page):\n    browser_page.set_content('<p id=\"p\">x</p>')\n"
    )
    (tmp_path / "test_b_loop.py").write_text(
        "import asyncio\n\n\nasync def one():\n    return 1\n\n\ndef test_loop():\n    assert asyncio.run(one()) == 1\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=180,
    )
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
