"""What the demo prints: its reports as rich tables."""

from __future__ import annotations

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from examples.closed_loop.loop import LoopReport
from examples.closed_loop.smoke import SmokeReport


def arrow_table(title: str, data: pa.Table) -> Table:
    table = Table(title=title)
    for name in data.column_names:
        table.add_column(name)
    for row in data.to_pylist():
        table.add_row(*("-" if v is None else str(v) for v in row.values()))
    return table


def print_smoke(console: Console, report: SmokeReport) -> None:
    console.print(f"[green]sent[/] {report.rollouts_sent} rollouts through the collector")
    console.print(arrow_table("lake tables", report.tables))
    console.print(arrow_table("reward by task (DuckDB over trajectories)", report.reward_by_task))
    console.print(f'done in {report.seconds:.0f}s; query more with: .venv/bin/agentlake query "SQL"')


def print_loop(console: Console, report: LoopReport) -> None:
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
