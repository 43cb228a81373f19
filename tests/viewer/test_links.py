"""Links to the viewer's pages from where people already are: Dagster check and asset metadata, the stack file.

A check that finds bad transitions names the first rollout holding one and links its page; the collapse checks
link the version they name; without ``viewer.public_url`` links follow the running stack's viewer (stack.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dagster import MetadataValue

from agentlake.stack import processes
from agentlake.stack.discovery import write_stack_file
from pipelines.defs.checks import transitions_finite, transitions_lengths
from pipelines.defs.health import result
from pipelines.defs.resources import LakeResource, ViewerResource, resources_from_settings, viewer_settings
from pipelines.lake.health import Finding
from schemas.config import HealthCheckSettings, Settings, load_settings
from tests.trainer.helpers import transition, write_transitions


def test_viewer_settings_link_public_url_or_own_address() -> None:
    s = Settings()
    assert s.viewer.enabled and s.viewer.host == "127.0.0.1"
    assert s.viewer.link("/rollouts/r-1") == f"http://127.0.0.1:{s.viewer.port}/rollouts/r-1"
    s.viewer.public_url = "https://viewer.example/lake/"
    assert s.viewer.link("versions/v0003") == "https://viewer.example/lake/versions/v0003"


def test_agentlake_toml_viewer_section(tmp_path: Path) -> None:
    cfg = tmp_path / "agentlake.toml"
    cfg.write_text('[viewer]\nenabled = false\nport = 9000\npublic_url = "https://v.example"\n')
    s = load_settings(cfg, environ={"AGENTLAKE_STATE_DIR": str(tmp_path / "state")})
    assert (s.viewer.enabled, s.viewer.port, s.viewer.url) == (False, 9000, "https://v.example")


def test_bad_rows_name_their_first_rollout_with_a_link(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    rows = [transition(i, [1, 2], [3, 4], advantage=1.0) for i in range(5)]
    rows[3]["advantage"] = float("nan")
    rows[4]["loss_mask"] = [1]  # one mask value for two response tokens
    rows[2]["loss_mask"] = [1, 1, 1]
    write_transitions(lake, rows)
    viewer = ViewerResource(viewer={"public_url": "https://viewer.example"}, state_dir=str(tmp_path / "state"))
    finite = transitions_finite(lake=LakeResource(root=str(lake)), viewer=viewer)
    assert not finite.passed and finite.metadata["first_rollout"] == MetadataValue.text("r0003")
    assert finite.metadata["first_rollout_page"] == MetadataValue.url("https://viewer.example/rollouts/r0003")
    lengths = transitions_lengths(lake=LakeResource(root=str(lake)), viewer=viewer)
    assert lengths.metadata["mismatched"] == MetadataValue.int(2)
    assert lengths.metadata["first_rollout_page"] == MetadataValue.url("https://viewer.example/rollouts/r0002")
    good = tmp_path / "good"
    write_transitions(good, rows[:2])
    clean = transitions_finite(lake=LakeResource(root=str(good)), viewer=viewer)
    assert clean.passed and "first_rollout" not in clean.metadata


def test_collapse_checks_link_each_version_they_name() -> None:
    viewer = ViewerResource(viewer={"public_url": "https://viewer.example"})
    finding = Finding(True, "KL", {"solver/version": "v0007", "solver/kl": 0.9, "coder/version": "v0002"})
    meta = result(finding, HealthCheckSettings(), "kl", viewer).metadata
    assert meta["solver/version_page"] == MetadataValue.url("https://viewer.example/versions/v0007")
    assert meta["coder/version_page"] == MetadataValue.url("https://viewer.example/versions/v0002")
    assert "solver/kl_page" not in meta


def test_links_follow_the_running_stacks_viewer(tmp_path: Path) -> None:
    """No public_url: the viewer's address `agentlake up` recorded in stack.json, while its process runs."""
    state = tmp_path / "state"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    processes.start(state, "viewer", sleeper, address="http://127.0.0.1:43210")
    try:
        settings = load_settings(None, environ={"AGENTLAKE_STATE_DIR": str(state), "AGENTLAKE_LAKE": str(tmp_path)})
        write_stack_file(state, settings, "127.0.0.1:9092")
        doc = (state / "stack.json").read_text()
        assert '"viewer"' in doc and "43210" in doc
        found = load_settings(None, environ={"AGENTLAKE_STATE_DIR": str(state)})
        assert found.viewer.link("/versions/v0001") == "http://127.0.0.1:43210/versions/v0001"
        assert viewer_settings({}, str(state)).port == 43210
        res = resources_from_settings(found)["viewer"]
        assert isinstance(res, ViewerResource)
        assert res.link("/rollouts/r1") == MetadataValue.url("http://127.0.0.1:43210/rollouts/r1")
    finally:
        processes.stop(state, "viewer")
    assert viewer_settings({"port": 8000}, str(state)).port == 8000  # the stack is gone: the settings' own
