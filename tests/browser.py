"""Browser tests' harness (loaded through ``pytest_plugins``): headless Debian Chromium driven by Playwright.

Why this shape: Playwright's Python package bundles its driver, but `playwright install` would download a
browser, which a closed CI machine cannot; so we launch Debian's ``/usr/bin/chromium`` (scripts/chromium.sh
installs it) with ``executable_path``. The flags keep Chromium off the network it cannot reach anyway
(without them it retries refused connections at every start). Playwright gives every launch a new, empty
profile (``--user-data-dir`` in a fresh temporary folder), so nothing leaks between sessions.

Fixtures: ``chromium`` (one browser per test module), ``browser_page`` (a fresh context and page per test,
screenshot saved when the test fails) and ``screenshots`` (save named screenshots under
``$BROWSER_ARTIFACTS`` or the test's ``tmp_path``; not an ``AGENTLAKE_`` name, which settings would
reject). ``serve_app`` serves an ASGI app on localhost for a test's page. Tests using them carry
``@pytest.mark.browser``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, Playwright, ViewportSize, sync_playwright

from collectors.listen import QuietServer, bind

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
# Headless, as root in a container, with no network beyond localhost: what the machine probe found to work.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS_ENV = "BROWSER_ARTIFACTS"
VIEWPORT: ViewportSize = {"width": 1400, "height": 900}


def chromium_path() -> str | None:
    """The Chromium to launch, or None where there is none (the browser tests then skip, saying why)."""
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


class Screenshots:
    """Saves screenshots under one folder, named by the caller: where a test's evidence goes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.saved: list[Path] = []

    def save(self, page: Page, name: str, *, full_page: bool = True, path: Path | None = None) -> Path:
        """Screenshot ``page`` as ``<folder>/<name>.png`` (or at ``path``, for a picture kept in docs/)."""
        target = path or self.folder / f"{_safe(name)}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target), full_page=full_page)
        self.saved.append(target)
        return target


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "page"


def artifacts_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """``$BROWSER_ARTIFACTS/<test name>`` when set (CI keeps it), else the test's tmp_path."""
    root = os.environ.get(ARTIFACTS_ENV, "").strip()
    if not root:
        return tmp_path / "screenshots"
    return Path(root) / _safe(request.node.nodeid)


@pytest.fixture(scope="module")
def playwright_driver() -> Iterator[Playwright]:
    """Playwright's bundled driver, started once per test module.

    Not per session: the sync API keeps an asyncio loop marked running in the main thread while it lives, so
    every later test calling ``asyncio.run`` would fail ("cannot be called from a running event loop"), as
    a CI run found. Module scope stops it before the next module runs.
    """
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def chromium(playwright_driver: Playwright) -> Iterator[Browser]:
    """One headless Debian Chromium per test module; skips (with the reason) where none is installed."""
    exe = chromium_path()
    if exe is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/chromium.sh installs Debian's chromium)")
    browser = playwright_driver.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture()
def screenshots(request: pytest.FixtureRequest, tmp_path: Path) -> Screenshots:
    """Where this test's screenshots go (see ``artifacts_dir``)."""
    return Screenshots(artifacts_dir(request, tmp_path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember each phase's report on the item, so ``browser_page`` knows whether the test failed."""
    outcome: Any = yield
    report = outcome.get_result()
    setattr(item, f"_browser_report_{report.when}", report)


@pytest.fixture()
def browser_page(chromium: Browser, screenshots: Screenshots, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh context and page for one test; on failure its last screen is saved as ``failure.png``."""
    context = chromium.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        report = getattr(request.node, "_browser_report_call", None)
        if report is not None and report.failed:
            with contextlib.suppress(Exception):
                shot = screenshots.save(page, "failure")
                print(f"browser_page: screenshot of the failure at {shot}")
        context.close()


@contextlib.contextmanager
def serve_app(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve an ASGI app on a free localhost port in a thread; yields its base URL (``http://host:port``)."""
    sock = bind(host, 0)
    port = sock.getsockname()[1]
    server = QuietServer(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test's page server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
