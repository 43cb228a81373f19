"""What each replica serves next to what the registry publishes (serving.served.against_registry), and
`agentlake status` showing it. Real Delta tables for the CLI; the comparison is a pure function."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from serving.served import against_registry

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SHA = {v: c * 64 for v, c in (("v0001", "1"), ("v0002", "2"), ("v0003", "3"))}


def _version(version: str, status: str, minute: int | None, agent: str | None = None) -> dict[str, Any]:
    return {
        "version": version,
        "agent": agent,
        "publish_status": status,
        "published_at": None if minute is None else T0.replace(minute=minute),
        "manifest_sha256": SHA[version],
    }


def _served(replica: str, name: str, sha: str | None) -> dict[str, Any]:
    return {"replica": replica, "served_name": name, "serving_sha256": sha}


def test_each_replica_is_current_stale_unknown_or_empty() -> None:
    registry = [
        _version("v0001", "published", 1),  # published first, still marked published
        _version("v0002", "published", 5),  # the newest published: what "p" should serve
        _version("v0003", "published", 3, agent="planner"),  # its own line, its own name
    ]
    served = [
        _served("a", "p", SHA["v0002"]),
        _served("b", "p", SHA["v0001"]),  # missed the last release
        _served("c", "p", "f" * 64),  # files nobody registered
        _served("d", "p", None),  # its vLLM lists nothing under the name
        _served("a", "p-planner", SHA["v0003"]),
    ]
    verdicts = against_registry(served, registry, "p")
    assert verdicts[("a", "p")] == "current"
    assert verdicts[("b", "p")] == "stale; registry: v0002"
    assert verdicts[("c", "p")] == "unknown adapter"
    assert verdicts[("d", "p")] == "serves nothing; registry: v0002"
    assert verdicts[("a", "p-planner")] == "current"


def test_a_failed_version_is_not_what_should_serve() -> None:
    registry = [_version("v0001", "published", 1), _version("v0002", "failed", None)]
    verdicts = against_registry([_served("a", "p", SHA["v0002"])], registry, "p")
    assert verdicts[("a", "p")] == "stale; registry: v0001"


def test_status_shows_each_replica_and_says_when_none_acked(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentlake.cli import app
    from schemas.lake import Lake
    from serving.loader import Served, build_ack
    from serving.releases import release_command
    from serving.served import record_acks

    lake = tmp_path / "lake"
    config = tmp_path / "agentlake.toml"
    config.write_text(
        f'[lake]\nroot = "{lake}"\n[state]\ndir = "{tmp_path / "state"}"\n[serving]\nreplicas = ["gpu-a", "gpu-b"]\n'
    )
    runner = CliRunner()
    before = runner.invoke(app, ["status", "--config", str(config)])
    assert "replicas gpu-a, gpu-b: none has acked a release yet" in before.output
    row = {
        "version": "v0002",
        "base_model": "base",
        "kind": "lora",
        "path": "/trainer/v0002",
        "parent_version": None,
        "artifact_uri": "s3://bucket/lake/models/v0002",
        "manifest_sha256": "e" * 64,
    }
    cmd = release_command(row, served_name="agentlake-policy")
    served = Served("/cache/eeee/v0002", "v0002", "e" * 64)
    record_acks(Lake(str(lake)), [build_ack(cmd, "gpu-a", error=None, served=served, seconds=0.3)])
    after = runner.invoke(app, ["status", "--config", str(config)], terminal_width=200)
    assert "gpu-a" in after.output and "v0002" in after.output
    assert "unknown" in after.output  # no registry row has that manifest
