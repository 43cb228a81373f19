"""``python -m examples.closed_loop``: run the closed loop on the local stack, then stop everything.

Agents act, Dagster trains, vLLM serves the new policy; ``--smoke`` runs only the data path
(synthetic traces, no model). ``agentlake demo`` and ``make demo`` launch this module.
Exit codes: 0 done, 1 a step failed (one red line says which), 2 bad options or configuration,
130 interrupted; the stack is stopped in every case.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from agentlake.stack import local
from examples.closed_loop.agents import AGENTS
from schemas.config import Settings, load_settings
from schemas.errors import AgentlakeError

console = Console()
AGENT_HELP = (
    "Which example agent learns: math (calculator through a text protocol), tools (the same calculator as a "
    "native function tool) or sql (text-to-SQL over a shop database)."
)
TRAFFIC_HELP = (
    "grouped: each task --samples times, its reward in the trace (GRPO). production: every task once, "
    "rewards posted late by another process, one in five never, a running baseline."
)
err_console = Console(stderr=True)


def _at_least(low: int):  # noqa: ANN202 - an argparse type
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is smaller than the minimum {low}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    """The options, with the defaults and help `agentlake demo` shows (a test keeps the two in step)."""
    p = argparse.ArgumentParser(prog="python -m examples.closed_loop", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="Only the data path: synthetic traces, no model.")
    p.add_argument("--rounds", type=_at_least(1), default=4, help="Training rounds.")
    p.add_argument("--tasks", type=_at_least(1), default=6, help="Tasks per round.")
    p.add_argument("--samples", type=_at_least(2), default=4, help="Rollouts per task (the GRPO group).")
    p.add_argument(
        "--eval-tasks", type=_at_least(1), default=128, help="Held-out tasks scored before and after (paired)."
    )
    p.add_argument("--eval-samples", type=_at_least(1), default=3, help="Seeded samples of each held-out task.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4, help="LoRA learning rate for the demo's rounds.")
    p.add_argument("--agent", choices=tuple(AGENTS), default="math", help=AGENT_HELP)
    p.add_argument("--traffic", choices=("grouped", "production"), default="grouped", help=TRAFFIC_HELP)
    p.add_argument("--config", "-c", default=None, help="Path to agentlake.toml (default: ./agentlake.toml).")
    return p


def _smoke(settings: Settings) -> None:
    from examples.closed_loop.report import print_smoke
    from examples.closed_loop.smoke import run_smoke_demo

    with console.status("starting") as spinner:
        report = run_smoke_demo(settings, on_step=lambda msg: spinner.update(msg))
    print_smoke(console, report)


def _loop(settings: Settings, args: argparse.Namespace) -> None:
    from examples.closed_loop.loop import LoopPlan, run_closed_loop
    from examples.closed_loop.report import print_loop

    plan = LoopPlan(
        rounds=args.rounds,
        tasks_per_round=args.tasks,
        samples_per_task=args.samples,
        eval_tasks=args.eval_tasks,
        eval_samples=args.eval_samples,
        seed=args.seed,
        learning_rate=args.lr,
        agent=args.agent,
        traffic=args.traffic,
    )
    with console.status("starting") as spinner:
        report = run_closed_loop(
            settings, plan, on_step=lambda msg: (spinner.update(msg), console.log(msg)), on_progress=spinner.update
        )
    print_loop(console, report)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
    except AgentlakeError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        return 2
    try:
        if args.smoke:
            _smoke(settings)
        else:
            _loop(settings, args)
    except AgentlakeError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    finally:
        stopped = local.down(settings)
        console.print(f"stopped: {', '.join(stopped) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
