"""`agentlake demo`: the README's main command."""

from __future__ import annotations

import pyarrow as pa
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


@app.command()
@handle_errors
def demo(config: str | None = ConfigOption) -> None:
    """Start the local stack, push a round of agent traces through it, show the tables, stop it."""
    from agentlake.demo import run_smoke_demo

    settings = settings_or_exit(config)
    try:
        with console.status("starting") as spinner:
            report = run_smoke_demo(settings, on_step=lambda msg: spinner.update(msg))
        console.print(f"[green]sent[/] {report.rollouts_sent} rollouts through the collector")
        console.print(_arrow_table("lake tables", report.tables))
        console.print(_arrow_table("reward by task (DuckDB over trajectories)", report.reward_by_task))
        console.print(f"done in {report.seconds:.0f}s; query more with: .venv/bin/agentlake query \"SQL\"")
    finally:
        stopped = local.down(settings)
        console.print(f"stopped: {', '.join(stopped) or 'nothing'}")
