"""The viewer in a real browser (Debian's Chromium through Playwright, tests/browser.py), as a person uses it:
from the rollouts list to one rollout, to the version that trained on it, and back; screenshots of each page.

The README's two pictures come from a real demo lake instead (scripts/readme_pictures.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from schemas.lake import Lake
from tests.browser import Screenshots, serve_app
from tests.viewer import versions_lake
from tests.viewer.conftest import viewer_settings
from viewer.app import create_app

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def trained_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """Rollouts, the registry line v0001 <- v0002 <- v0003, what each trained on, an evaluation (versions_lake)."""
    return versions_lake.build(tmp_path_factory.mktemp("browser") / "lake")


def test_click_from_the_list_to_a_rollout_to_its_version_and_back(
    browser_page: Page, screenshots: Screenshots, trained_lake: Lake, tmp_path: Path
) -> None:
    page = browser_page
    with serve_app(create_app(viewer_settings(tmp_path / "state"), trained_lake)) as base:
        page.goto(f"{base}/rollouts")
        expect(page.locator("h1")).to_contain_text("Rollouts")
        screenshots.save(page, "1-rollouts")

        page.get_by_role("link", name="a-r2", exact=True).click()  # trained into v0002 (its lineage)
        page.wait_for_url(re.compile(r"/rollouts/a-r2"))
        expect(page.locator("h1")).to_contain_text("a-r2")
        expect(page.locator("#transitions")).to_be_visible()
        screenshots.save(page, "2-rollout")

        page.locator(".trained-in").get_by_role("link", name="v0002").click()
        page.wait_for_url(f"{base}/versions/v0002")
        expect(page.locator("h1")).to_contain_text("v0002")
        expect(page.get_by_role("link", name="a-r2", exact=True)).to_be_visible()  # among the rollouts it trained on
        screenshots.save(page, "3-version")

        page.go_back()
        page.wait_for_url(re.compile(r"/rollouts/a-r2"))
        expect(page.locator("h1")).to_contain_text("a-r2")
        page.go_back()
        page.wait_for_url(f"{base}/rollouts")
        expect(page.get_by_role("link", name="a-r2", exact=True)).to_be_visible()
        screenshots.save(page, "4-back-to-the-list")
    assert [p.name for p in screenshots.saved] == [
        "1-rollouts.png",
        "2-rollout.png",
        "3-version.png",
        "4-back-to-the-list.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in screenshots.saved)  # pages rendered, not blank


def test_a_rollout_and_a_version_page_render_every_section(
    browser_page: Page, screenshots: Screenshots, viewer_lake: Lake, trained_lake: Lake, tmp_path: Path
) -> None:
    """A rollout (its calls, rewards with the judge's reason, tokens by loss mask and advantage, credit variants) and a
    version (lineage, evaluation with its interval, reward over time, what it trained on)."""
    page = browser_page
    with serve_app(create_app(viewer_settings(tmp_path / "s1"), viewer_lake)) as base:
        page.goto(f"{base}/rollouts/r0?tenant=default")  # three calls merged, the judge, a late reward
        expect(page.locator("h1")).to_contain_text("r0")
        page.locator("#rewards").evaluate("e => e.scrollIntoView()")  # rewards, then the tokens by mask and advantage
        shot = screenshots.save(page, "readme-rollout", full_page=False, path=None)
    with serve_app(create_app(viewer_settings(tmp_path / "s2"), trained_lake)) as base:
        page.goto(f"{base}/versions/v0002")
        expect(page.locator("h1")).to_contain_text("v0002")
        other = screenshots.save(page, "readme-version", full_page=False, path=None)
    assert shot.read_bytes()[:4] == other.read_bytes()[:4] == b"\x89PNG"
