"""The README's two viewer pictures, from a real lake (a `make demo` run's): a trained rollout's page and the
last version's page, in Debian's Chromium (tests/browser.py's flags).

    agentlake ui --lake LAKE --port 8799 &
    .venv/bin/python scripts/readme_pictures.py LAKE http://127.0.0.1:8799

The rollout is the one with the largest advantage among those the last version trained on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
from playwright.sync_api import sync_playwright

from tests.browser import CHROMIUM_ARGS, chromium_path

DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def main(lake: str, base: str) -> None:
    lineage = pl.read_delta(f"{lake}/training_lineage")
    last = lineage["model_version"].max()
    trained = pl.read_delta(f"{lake}/transitions").join(
        lineage.filter(pl.col("model_version") == last).select("transition_id"), on="transition_id"
    )
    rollout = trained.sort("advantage", descending=True)["rollout_id"][0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1280})
        page.goto(f"{base}/rollouts/{rollout}")
        page.screenshot(path=str(DOCS_IMG / "viewer-rollout.png"))
        page.goto(f"{base}/versions/{last}")
        page.screenshot(path=str(DOCS_IMG / "viewer-version.png"))
        browser.close()
    print(f"rollout {rollout}, version {last} -> {DOCS_IMG}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
