"""Staleness within a policy line (issue 13): a line's round counts its own versions, in the skip and the metrics.

Version names are one sequence across the lines, so with the planner's versions v0001 and v0005 and
the solver's v0002..v0004 in between, a planner row of v0001 is one planner version behind v0005,
not four. The single policy counts every registry version, as before (``tests/trainer/test_tis.py``).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest

from schemas.lake import Lake
from tests.trainer.helpers import transition, write_transitions
from trainer.config import TrainConfig
from trainer.offpolicy import split_stale, staleness, with_skipped
from trainer.registry import Registry
from trainer.round import train_once

PROMPT, RESPONSE = [3, 4, 5, 6], [7, 8, 9]
LINES = ["planner", "solver", "solver", "solver", "planner"]  # v0001..v0005, interleaved
PLANNER = ["v0001", "v0005"]


def _registry(lake: Path) -> Registry:
    registry = Registry(Lake(str(lake)))
    for n, agent in enumerate(LINES, start=1):
        registry.add(version=f"v{n:04d}", version_number=n, base_model="tiny", kind="lora", path="/x", agent=agent)
    return registry


def test_staleness_counts_the_lines_versions_only(lake: Path) -> None:
    registry = _registry(lake)
    assert registry.line_versions("planner") == PLANNER
    assert registry.line_versions("solver") == ["v0002", "v0003", "v0004"]
    assert registry.line_versions() == []

    row = "agentlake-policy-planner@v0001"
    assert staleness(row, "v0005", line_versions=PLANNER) == 1  # three solver versions came in between
    assert staleness(row, "v0005") == 4  # the single policy's count: every registry version
    assert staleness("agentlake-policy-planner@v0005", "v0005", line_versions=PLANNER) == 0
    assert staleness("agentlake-policy-planner@v0001", "v0001", line_versions=PLANNER) == 0
    assert staleness("agentlake-policy-solver@v0003", "v0005", line_versions=PLANNER) is None  # not the line's
    assert staleness("agentlake-base", "v0005", line_versions=PLANNER) is None
    assert staleness(None, "v0005", line_versions=PLANNER) is None
    assert staleness(row, None, line_versions=PLANNER) is None  # ahead of the base model
    assert staleness(row, "v0003", line_versions=PLANNER) is None  # the current version is none of the line's


def test_the_skip_and_the_recorded_staleness_agree_within_a_line(lake: Path) -> None:
    registry = _registry(lake)
    line = registry.line_versions("planner")
    pvs = ["agentlake-policy-planner@v0001", "agentlake-policy-planner@v0005", "base", None]
    rows = pa.table({"policy_version": pa.array(pvs, pa.string()), "i": pa.array(range(4))})

    assert split_stale(rows, current_version="v0005", max_staleness=1)[1] == {"v0001": 1}  # across lines: 4 > 1
    kept, skipped = split_stale(rows, current_version="v0005", max_staleness=1, line_versions=line)
    assert (kept["i"].to_pylist(), skipped) == ([0, 1, 2, 3], {})
    kept, skipped = split_stale(rows, current_version="v0005", max_staleness=0, line_versions=line)
    assert (kept["i"].to_pylist(), skipped) == ([1, 2, 3], {"v0001": 1})

    recorded = with_skipped({}, skipped, current_version="v0005", line_versions=line)
    assert recorded == {"v0001": {"rows": 0, "tokens": 0, "staleness": 1, "uncorrected_rows": 0, "skipped_stale": 1}}
    # Stats a training loop counted across lines are recorded with the line's count.
    trained = {"v0001": {"rows": 2, "tokens": 6, "staleness": 4, "uncorrected_rows": 2}}
    assert with_skipped(trained, {}, current_version="v0005", line_versions=line)["v0001"]["staleness"] == 1
    assert with_skipped(trained, {}, current_version="v0005")["v0001"]["staleness"] == 4  # single policy: as before


def _cfg(model: Path, lake: Path, tmp_path: Path, **kw: object) -> TrainConfig:
    base: dict[str, object] = dict(
        base_model=str(model),
        lake_root=str(lake),
        checkpoint_dir=str(tmp_path / "models"),
        lora_rank=4,
        learning_rate=1e-3,
        batch_size=4,
        max_steps=1,
        min_new_transitions=1,
        progress=False,
        seed=0,
    )
    return TrainConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.slow  # several training rounds: ~10 s
def test_a_lines_round_skips_and_records_by_its_own_versions(lake: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_model_dir, lake, tmp_path, max_staleness=1)
    registry = Registry(Lake(str(lake)))
    first = iter(range(1000))

    def rows(agent: str, pv: str, n: int = 2) -> list[dict[str, object]]:
        return [
            transition(next(first), PROMPT, RESPONSE, advantage=1.0, agent=agent, policy_version=pv) for _ in range(n)
        ]

    def trained(agent: str, pv: str) -> str:
        write_transitions(lake, rows(agent, pv))
        result = train_once(cfg=cfg, line=agent)
        assert result.version is not None, result.reason
        registry.set_status(result.version, "published", published_at=dt.datetime.now(dt.UTC))
        return result.version

    assert trained("planner", "agentlake-base") == "v0001"
    assert [trained("solver", "agentlake-base") for _ in range(3)] == ["v0002", "v0003", "v0004"]
    assert trained("planner", "agentlake-policy-planner@v0001") == "v0005"

    # From v0005: rows of v0001 are one planner version behind (four registry versions), within max_staleness=1.
    write_transitions(
        lake, rows("planner", "agentlake-policy-planner@v0001") + rows("planner", "agentlake-policy-planner@v0005", 1)
    )
    result = train_once(cfg=cfg, line="planner")
    assert (result.version, result.parent_version, result.metrics["n_examples"]) == ("v0006", "v0005", 3)
    recorded = json.loads(registry.get("v0006")["metrics"])["offpolicy"]
    assert recorded == result.offpolicy
    assert (recorded["v0001"]["rows"], recorded["v0001"]["staleness"], recorded["v0001"]["skipped_stale"]) == (2, 1, 0)
    assert (recorded["v0005"]["rows"], recorded["v0005"]["staleness"]) == (1, 0)

    # At max_staleness=0 the same rows are skipped, and counted one version stale (v0006 is not published).
    write_transitions(lake, rows("planner", "agentlake-policy-planner@v0001"))
    skipped = train_once(cfg=cfg.replace(max_staleness=0), line="planner")
    assert skipped.version is None and "max_staleness=0" in skipped.reason
    assert skipped.offpolicy == {
        "v0001": {"rows": 0, "tokens": 0, "staleness": 1, "uncorrected_rows": 0, "skipped_stale": 2}
    }
