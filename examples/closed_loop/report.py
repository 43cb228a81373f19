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
    production = report.traffic == "production"
    table = Table(title=f"reward per round ({report.agent} agent, {report.traffic} traffic)")
    columns = ["round", "served by", "rollouts", "mean reward"]
    columns += ["rewarded in time", "late", "never", "trained on"] if production else []
    for col in (*columns, "trained", "loss", "seconds"):
        table.add_column(col)
    for r in report.rounds:
        cells = [str(r.round), r.policy_version, str(r.rollouts), f"{r.mean_reward:.3f}"]
        if production:
            cells += [str(r.rewarded), str(r.late), str(r.never), str(r.trained_rollouts)]
        cells += [r.trained_version or "-", "-" if r.loss is None else f"{r.loss:.4f}", f"{r.seconds:.0f}"]
        table.add_row(*cells)
    console.print(table)
    if production:
        console.print(
            "rewarded in time: this round's rollouts whose reward came before it trained; late: came later "
            "(trained next round, off-policy); never: dropped at the reward horizon; trained on: rollouts "
            "this round's version learned from"
        )
    console.print(held_out_line(report))
    console.print(f"reward curve: {report.plot}   total {report.seconds / 60:.1f} min")


def held_out_line(report: LoopReport) -> str:
    """Before, after and their paired difference, each with its interval, and the verdict: one paragraph."""
    (b_lo, b_hi), (a_lo, a_hi), (d_lo, d_hi) = report.eval_before_ci, report.eval_after_ci, report.eval_diff_ci
    color = (
        "green"
        if report.eval_verdict.startswith("gain")
        else "red"
        if report.eval_verdict.startswith("loss")
        else "yellow"
    )
    return (
        f"held-out mean reward on {report.eval_tasks} tasks x {report.eval_samples} samples (same tasks and "
        f"sampling seeds before and after): before ({report.eval_before_version}) {report.eval_before:.3f} "
        f"[{b_lo:.3f}, {b_hi:.3f}], after ({report.eval_after_version}) {report.eval_after:.3f} "
        f"[{a_lo:.3f}, {a_hi:.3f}]; difference {report.eval_diff:+.3f} [{d_lo:+.3f}, {d_hi:+.3f}] "
        f"({report.eval_confidence:.0%} bootstrap over tasks): [{color}]{report.eval_verdict}[/]"
    )
