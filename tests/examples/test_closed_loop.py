"""The closed-loop demo's launcher (`agentlake demo`) and the demo's wait for a round's transitions.

The demo lives in ``examples/closed_loop`` and runs from a source checkout; the front door only
launches it, with the same options, and never imports ``examples``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from agentlake.cli import app
from agentlake.cli import demo as launcher
from examples.closed_loop.__main__ import parser
from examples.closed_loop.loop import wait_for_transitions
from schemas.config import load_settings
from schemas.errors import AgentlakeError
from tests.trainer.helpers import transition, write_transitions

REPO = Path(__file__).resolve().parents[2]
FRONT_DOOR = ("agentlake", "collectors", "pipelines", "trainer", "schemas")


def _demo_command() -> click.Command:
    return typer.main.get_command(app).commands["demo"]  # type: ignore[attr-defined]


def test_the_launcher_has_the_options_defaults_and_help_of_the_demo() -> None:
    actions = {a.option_strings[0]: a for a in parser()._actions if a.option_strings and a.dest != "help"}
    params = {p.opts[0]: p for p in _demo_command().params}
    assert sorted(params) == sorted(actions)
    for name, param in params.items():
        assert param.default == actions[name].default, name
        assert (getattr(param, "help", None) or None) == actions[name].help, name
    assert parser().parse_args(launcher.demo_argv(**parser().parse_args([]).__dict__)[4:]) == parser().parse_args([])


def test_the_launcher_passes_every_option_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], Path]] = []
    monkeypatch.setattr(launcher, "run_demo", lambda argv, root: seen.append((argv, root)) or 7)
    args = ["--smoke", "--rounds", "2", "--tasks", "3", "--samples", "5", "--eval-tasks", "9", "--seed", "4"]
    args += ["--agent", "sql", "--traffic", "production", "--eval-samples", "6"]
    result = CliRunner().invoke(app, ["demo", *args, "--lr", "0.001", "--config", "x.toml"])
    assert result.exit_code == 7, result.output  # the demo's exit code
    [(argv, root)] = seen
    assert root == REPO and argv[:4] == [sys.executable, "-P", "-m", "examples.closed_loop"]
    parsed = parser().parse_args(argv[4:])
    assert (parsed.smoke, parsed.rounds, parsed.tasks, parsed.samples, parsed.eval_tasks) == (True, 2, 3, 5, 9)
    assert (parsed.seed, parsed.lr, parsed.config) == (4, 0.001, "x.toml")
    assert (parsed.agent, parsed.traffic, parsed.eval_samples) == ("sql", "production", 6)


def test_the_launcher_refuses_an_unknown_agent_or_traffic() -> None:
    for option, value in (("--agent", "chess"), ("--traffic", "bursty")):
        result = CliRunner().invoke(app, ["demo", option, value])
        assert result.exit_code == 2 and value in result.output


def test_without_a_checkout_the_launcher_says_where_the_demo_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "checkout_root", lambda: None)
    result = CliRunner().invoke(app, ["demo", "--smoke"])
    assert result.exit_code == 2
    assert "source checkout" in " ".join(result.output.split())


def test_run_demo_returns_the_exit_code_with_the_checkout_on_the_path(tmp_path: Path) -> None:
    script = "import sys, examples.closed_loop as m; sys.exit(3 if m.__file__.startswith(sys.argv[1]) else 1)"
    assert launcher.run_demo([sys.executable, "-P", "-c", script, str(REPO)], REPO) == 3


def test_no_front_door_module_imports_examples() -> None:
    offenders = []
    for package in FRONT_DOOR:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "examples"]
    assert offenders == []


def test_wait_for_transitions_matches_the_tenant_and_the_rollout(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    settings = load_settings(environ={}, overrides={"lake": {"root": str(lake)}, "state": {"dir": str(tmp_path)}})
    mine, theirs = transition(1, [1, 2], [3], advantage=1.0), transition(2, [1, 2], [3], advantage=1.0)
    theirs["tenant"], theirs["transition_id"] = "acme", theirs["transition_id"] + "@acme"
    write_transitions(lake, [mine, theirs])

    wait_for_transitions(settings, {"r0001"}, timeout_s=5)  # returns at once
    with pytest.raises(AgentlakeError, match="1 of 2 rollouts of tenant 'default'"):
        wait_for_transitions(settings, {"r0001", "r0002"}, timeout_s=0.1)  # r0002 is another tenant's
    wait_for_transitions(settings, {"r0002"}, tenant="acme", timeout_s=5)
