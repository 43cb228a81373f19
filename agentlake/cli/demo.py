"""`agentlake demo`: the README's main command, a launcher for the closed-loop demo.

The demo drives an example agent, so it lives with the examples (``examples/closed_loop``) and runs
from a source checkout: this command finds that checkout (next to the installed ``agentlake``
package, else the working directory) and runs ``python -m examples.closed_loop`` there with the
same options, in the working directory (where ``agentlake.toml`` and ``.agentlake`` are). Its exit
code is the demo's; on Ctrl-C the demo stops the stack before it exits, and this command waits for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from enum import StrEnum
from pathlib import Path

import typer

import agentlake
from agentlake.cli.app import ConfigOption, app, err_console

DEMO_MODULE = "examples.closed_loop"
# The demo's own choices and help (examples/closed_loop/__main__.py; a test keeps the two in step).


class DemoAgent(StrEnum):
    math = "math"
    tools = "tools"
    sql = "sql"


class Traffic(StrEnum):
    grouped = "grouped"
    production = "production"


AGENT_HELP = (
    "Which example agent learns: math (calculator through a text protocol), tools (the same calculator as a "
    "native function tool) or sql (text-to-SQL over a shop database)."
)
TRAFFIC_HELP = (
    "grouped: each task --samples times, its reward in the trace (GRPO). production: every task once, "
    "rewards posted late by another process, one in five never, a running baseline."
)

AgentOption = typer.Option(DemoAgent.math, help=AGENT_HELP)
TrafficOption = typer.Option(Traffic.grouped, help=TRAFFIC_HELP)


def checkout_root() -> Path | None:
    """The source checkout holding ``examples/closed_loop``: beside the package, else the working directory."""
    for root in (Path(agentlake.__file__).resolve().parents[1], Path.cwd()):
        if (root / "examples" / "closed_loop" / "__main__.py").is_file():
            return root
    return None


def demo_argv(
    *,
    smoke: bool,
    rounds: int,
    tasks: int,
    samples: int,
    eval_tasks: int,
    seed: int,
    eval_samples: int = 3,
    lr: float,
    config: str | None,
    agent: str = "math",
    traffic: str = "grouped",
) -> list[str]:
    """The demo module's command line for these options (``-P``: the working directory stays off its path)."""
    argv = [sys.executable, "-P", "-m", DEMO_MODULE]
    argv += ["--rounds", str(rounds), "--tasks", str(tasks), "--samples", str(samples)]
    argv += [
        "--eval-tasks",
        str(eval_tasks),
        "--eval-samples",
        str(eval_samples),
        "--seed",
        str(seed),
        "--lr",
        repr(lr),
    ]
    argv += ["--agent", agent, "--traffic", traffic]
    if smoke:
        argv.append("--smoke")
    if config is not None:
        argv += ["--config", config]
    return argv


def run_demo(argv: list[str], root: Path) -> int:
    """Run the demo with ``root`` first on its path and return its exit code (128 + N when signal N ended it).

    A Ctrl-C at the terminal reaches the whole foreground process group, the demo included: the demo
    stops the stack and exits, and this process only waits for it (a second copy of the signal would
    interrupt that clean-up). A SIGTERM sent to this process is passed on as a Ctrl-C.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(argv, env=env)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, lambda _sig, _frame: None)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: proc.send_signal(signal.SIGINT))
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


@app.command()
def demo(
    smoke: bool = typer.Option(False, "--smoke", help="Only the data path: synthetic traces, no model."),
    rounds: int = typer.Option(4, min=1, help="Training rounds."),
    tasks: int = typer.Option(6, min=1, help="Tasks per round."),
    samples: int = typer.Option(4, min=2, help="Rollouts per task (the GRPO group)."),
    eval_tasks: int = typer.Option(128, min=1, help="Held-out tasks scored before and after (paired)."),
    eval_samples: int = typer.Option(3, min=1, help="Seeded samples of each held-out task."),
    seed: int = typer.Option(0),
    lr: float = typer.Option(3e-4, help="LoRA learning rate for the demo's rounds."),
    agent: DemoAgent = AgentOption,
    traffic: Traffic = TrafficOption,
    config: str | None = ConfigOption,
) -> None:
    """Run the closed loop: agents act, Dagster trains, vLLM serves the new policy; stop everything after."""
    root = checkout_root()
    if root is None:
        err_console.print(
            "[bold red]error:[/] the demo runs from a source checkout of agentlake (it drives the example agents "
            "in examples/, which the package does not ship): clone the repository and run `make demo` or "
            "`agentlake demo` there"
        )
        raise typer.Exit(2)
    argv = demo_argv(
        smoke=smoke,
        rounds=rounds,
        tasks=tasks,
        samples=samples,
        eval_tasks=eval_tasks,
        eval_samples=eval_samples,
        seed=seed,
        lr=lr,
        config=config,
        agent=agent.value,
        traffic=traffic.value,
    )
    raise typer.Exit(run_demo(argv, root))
