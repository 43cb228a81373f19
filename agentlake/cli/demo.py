"""`agentlake demo`: the README's main command."""

from __future__ import annotations

import pyarrow as pa
import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from agentlake.stack import local


def _arrow_table(title: str, data: pa.Table) -> Table:
    table = Table(title=title)
    for name in data.column_names:
        table.add_column(name)
    for row in data.to_pylist():
        table.add_row(*("-" if v is None else str(v) for v in row.values()))
    return table


def _smoke(settings) -> None:  # noqa: ANN001 - Settings
    from agentlake.demo import run_smoke_demo

    with console.status("starting") as spinner:
        report = run_smoke_demo(settings, on_step=lambda msg: spinner.update(msg))
    console.print(f"[green]sent[/] {report.rollouts_sent} rollouts through the collector")
    console.print(_arrow_table("lake tables", report.tables))
    console.print(_arrow_table("reward by task (DuckDB over trajectories)", report.reward_by_task))
    console.print(f'done in {report.seconds:.0f}s; query more with: .venv/bin/agentlake query "SQL"')


def _loop(settings, plan) -> None:  # noqa: ANN001 - Settings, LoopPlan
    from agentlake.loop import run_closed_loop

    with console.status("starting") as spinner:
        report = run_closed_loop(
            settings, plan, on_step=lambda msg: (spinner.update(msg), console.log(msg)), on_progress=spinner.update
        )
    table = Table(title="reward per round")
    for col in ("round", "served by", "rollouts", "mean reward", "trained", "loss", "seconds"):
        table.add_column(col)
    for r in report.rounds:
        table.add_row(
            str(r.round),
            r.policy_version,
            str(r.rollouts),
            f"{r.mean_reward:.3f}",
            r.trained_version or "-",
            "-" if r.loss is None else f"{r.loss:.4f}",
            f"{r.seconds:.0f}",
        )
    console.print(table)
    console.print(
        f"held-out mean reward on {report.eval_tasks} tasks: before {report.eval_before:.3f}, "
        f"after {report.eval_after:.3f} ({report.eval_after - report.eval_before:+.3f})"
    )
    console.print(f"reward curve: {report.plot}   total {report.seconds / 60:.1f} min")


@app.command()
@handle_errors
def demo(
    smoke: bool = typer.Option(False, "--smoke", help="Only the data path: synthetic traces, no model."),
    rounds: int = typer.Option(4, min=1, help="Training rounds."),
    tasks: int = typer.Option(6, min=1, help="Tasks per round."),
    samples: int = typer.Option(4, min=2, help="Rollouts per task (the GRPO group)."),
    eval_tasks: int = typer.Option(32, min=1, help="Held-out tasks scored before and after (2 samples each)."),
    seed: int = typer.Option(0),
    lr: float = typer.Option(3e-4, help="LoRA learning rate for the demo's rounds."),
    config: str | None = ConfigOption,
) -> None:
    """Run the closed loop: agents act, Dagster trains, vLLM serves the new policy; stop everything after."""
    settings = settings_or_exit(config)
    try:
        if smoke:
            _smoke(settings)
        else:
            from agentlake.loop import LoopPlan

            _loop(
                settings,
                LoopPlan(
                    rounds=rounds,
                    tasks_per_round=tasks,
                    samples_per_task=samples,
                    eval_tasks=eval_tasks,
                    seed=seed,
                    learning_rate=lr,
                ),
            )
    finally:
        stopped = local.down(settings)
        console.print(f"stopped: {', '.join(stopped) or 'nothing'}")
