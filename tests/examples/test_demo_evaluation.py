"""The demo's paired evaluation: held-out tasks with headroom, the comparison it reports, and the rows it stores.

No model here: the rewards are given, the lake is a real Delta folder, the curve a real PNG. Against vLLM, the
held-out set's base score and the seeded samples were measured once (docs/demo.md) and the demo runs it all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from examples.closed_loop.agents import HELD_OUT_KINDS, MATH_KINDS, TRAIN_KINDS, agent_kit
from examples.closed_loop.loop import LoopPlan, LoopReport, RoundRecord, compare_evaluations, plot_rewards
from examples.closed_loop.report import print_loop
from schemas.config import load_settings
from schemas.lake import Lake
from serving.evaluation_table import describe, latest


def test_the_held_out_set_is_large_harder_and_drawn_apart_from_training() -> None:
    kit = agent_kit("math")
    plan = LoopPlan()
    assert (plan.eval_tasks, plan.eval_samples) == (128, 3)
    held = kit.heldout_tasks(plan.eval_tasks)
    assert len({t.task_id for t in held}) == 128 and held == kit.heldout_tasks(128)  # fixed, whatever the seed
    assert set(HELD_OUT_KINDS) <= set(TRAIN_KINDS) and set(MATH_KINDS) <= set(TRAIN_KINDS)
    # larger numbers than the kinds the worked example shows: answers of 4-6 digits
    assert min(t.answer for t in held) >= 13 * 13 and max(t.answer for t in held) >= 10_000
    trained = {t.question for r in range(1, 50) for t in kit.train_tasks(8, r, f"train-r{r}")}
    assert not trained & {t.question for t in held}


def _settings(tmp_path: Path):  # noqa: ANN202 - Settings
    return load_settings(
        environ={}, overrides={"lake": {"root": str(tmp_path / "lake")}, "state": {"dir": str(tmp_path / "state")}}
    )


def test_the_report_the_table_and_the_curve_carry_the_interval_and_verdict(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    plan = LoopPlan(eval_tasks=40, eval_samples=2, seed=1)
    # before: 16 of 40 tasks right (both samples); after: those and 12 more. A gain beyond noise.
    before = {f"heldout-{i}": [1.0, 1.0] if i < 16 else [0.0, 0.0] for i in range(40)}
    after = {f"heldout-{i}": [1.0, 1.0] if i < 28 else [0.0, 0.0] for i in range(40)}
    report = LoopReport(eval_tasks=40, eval_samples=2, eval_before_version="v0001", eval_after_version="v0005")
    report.rounds = [RoundRecord(round=1, policy_version="v0001", rollouts=8, mean_reward=0.5, seconds=1.0)]
    compare_evaluations(report, settings, plan, before, after)
    assert (report.eval_before, report.eval_after, report.eval_diff) == (0.4, 0.7, pytest.approx(0.3))
    assert report.eval_verdict == "gain beyond noise" and 0 < report.eval_diff_ci[0] < 0.3 < report.eval_diff_ci[1]
    assert report.eval_before_ci[0] < 0.4 < report.eval_before_ci[1]

    rows = latest(Lake.from_settings(settings))
    assert set(rows) == {"v0001", "v0005"}
    first, last = rows["v0001"], rows["v0005"]
    assert (first["n_tasks"], first["n_samples"], first["source"], first["task_set"]) == (
        40,
        2,
        "demo",
        "demo-math-heldout",
    )
    assert first["baseline_version"] is None and first["verdict"] is None
    assert (last["baseline_version"], last["baseline_mean"], last["verdict"]) == ("v0001", 0.4, "gain beyond noise")
    assert (last["diff_ci_low"], last["diff_ci_high"]) == report.eval_diff_ci
    assert re.fullmatch(
        r"0\.700 \[0\.\d+, 0\.\d+\] on demo-math-heldout \(40 tasks x 2\); vs v0001 \+0\.300 \[\+0\.\d+, \+0\.\d+\]: "
        r"gain beyond noise",
        describe(last),
    )

    console = Console(record=True, width=400)
    print_loop(console, report)
    text = console.export_text()
    assert "before (v0001) 0.400 [" in text and "after (v0005) 0.700 [" in text
    assert "difference +0.300 [+" in text and "(95% bootstrap over tasks): gain beyond noise" in text
    png = plot_rewards(report, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second evaluation of v0005 is its latest
    compare_evaluations(report, settings, plan, after, after)
    assert latest(Lake.from_settings(settings))["v0005"]["verdict"] == "within noise"
