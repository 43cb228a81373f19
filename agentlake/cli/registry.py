"""`agentlake model list | show | fetch | publish | rollback`: policy versions in the model registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, console, handle_errors, settings_or_exit
from agentlake.cli.model import model_app
from schemas.config import Settings

if TYPE_CHECKING:  # the trainer is imported lazily, at the call
    from trainer.registry import Registry


def _registry(settings: Settings) -> Registry:
    from schemas.lake import Lake
    from trainer.registry import Registry

    return Registry(Lake.from_settings(settings))


def _restart(settings: Settings) -> Callable[[str], None]:
    """Full-weight versions: restart the vLLM this state folder manages, its steps printed."""
    from agentlake.stack.vllm import vllm_restarter

    return vllm_restarter(settings, on_step=lambda msg: console.print(f"  {msg}"))


def _evaluations(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each version's latest row of the `evaluations` table (empty when none, or when it cannot be read)."""
    from schemas.lake import Lake
    from serving.evaluation_table import latest

    try:
        return latest(Lake.from_settings(settings))
    except Exception as exc:  # noqa: BLE001 - the registry lists without its evaluations
        console.print(f"[yellow]cannot read the evaluations table: {exc}[/]")
        return {}


def _trained_on(settings: Settings, row: dict[str, Any]) -> str:
    """How many transitions a version trained on and from which table versions, from ``training_lineage``."""
    from schemas.lake import Lake
    from trainer.lineage import Lineage

    lin = Lineage(Lake.from_settings(settings))
    info = lin.summary(row["version"])
    n = info["transitions"]
    if n == 0:
        return f"{row['n_transitions'] or 0} transitions (none recorded in {lin.uri})"
    read_at = ", ".join(str(v) for v in info["table_versions"])
    out = f"{n} transitions of {', '.join(info['tables'])} read at table version {read_at}"
    start = row["train_version_start"]
    if json.loads(row["config"] or "{}").get("version_start") is not None:
        out += f": the ids added after table version {start} (--from-version)"
    elif start is None or start < 0:
        out += ": the first round on this table"
    else:
        out += f": the ones no earlier version trained on (the previous round read version {start})"
    if row["n_transitions"] is not None and row["n_transitions"] != n:
        out += f" [yellow]registry says {row['n_transitions']}[/]"
    return out + f"; SQL: SELECT * FROM training_lineage WHERE model_version = '{row['version']}'"


EvalTasksOption = typer.Option(
    None,
    "--eval-tasks",
    help="JSONL of {prompt, answer}: publish unless worse than the serving version beyond noise "
    "(serving.eval_gate_confidence; default: trainer.eval_tasks).",
)


@model_app.command("list")
@handle_errors
def list_versions(config: str | None = ConfigOption) -> None:
    """Every policy version, oldest first; the serving one (of each agent's line) is starred."""
    settings = settings_or_exit(config)
    reg = _registry(settings)
    rows = reg.rows()
    if not rows:
        console.print(f"no policy versions yet in {reg.uri}; run `agentlake train --once`")
        return
    agents = {r["agent"] for r in rows}  # policy lines (trainer.agents); {None}: the single policy
    serving = {(reg.serving(agent=a) or {}).get("version") for a in agents}
    table = Table("version", "parent", "kind", "status", "data (versions)", "rows", "final loss", "created")
    if agents != {None}:
        table.add_column("line")

    for r in rows:
        loss = json.loads(r["metrics"] or "{}").get("final_loss")
        line = [r["agent"] or "-"] if agents != {None} else []
        table.add_row(
            ("* " if r["version"] in serving else "  ") + r["version"],
            r["parent_version"] or "-",
            r["kind"],
            r["publish_status"],
            f"({r['train_version_start']}, {r['train_version_end']}]",
            str(r["n_transitions"] or 0),
            "-" if loss is None else f"{loss:.4f}",
            r["created_at"].strftime("%Y-%m-%d %H:%M:%S"),
            *line,
        )
    console.print(table)
    from serving.evaluation_table import describe

    evaluations = _evaluations(settings)
    if evaluated := [r["version"] for r in rows if r["version"] in evaluations]:
        console.print("latest held-out evaluation of each version (mean [95% interval] over tasks; `evaluations`):")
        for version in evaluated:
            console.print(f"  {version}: {describe(evaluations[version])}")
    from agentlake.cli.serving import served_table

    if (replicas := served_table(settings)) is not None:
        console.print("what each replica serves (`agentlake model served`):")
        console.print(replicas)


@model_app.command()
@handle_errors
def show(version: str = typer.Argument(..., help="A version, e.g. v0003."), config: str | None = ConfigOption) -> None:
    """One version: where it lives, what it trained on, its lineage, config and metrics."""
    settings = settings_or_exit(config)
    reg = _registry(settings)
    row = reg.get(version)
    for key in ("version", "kind", "publish_status", "publish_error", "base_model", "path", "artifact_uri",
                "manifest_sha256", "served_name", "agent", "train_table", "train_version_start", "train_version_end",
                "n_transitions", "created_at", "published_at"):  # fmt: skip
        console.print(f"[bold]{key}[/]: {row[key]}")
    console.print(f"[bold]trained on[/]: {_trained_on(settings, row)}")
    console.print("[bold]lineage[/]: " + " <- ".join(r["version"] for r in reg.lineage(version)))
    console.print("[bold]metrics[/]:", json.loads(row["metrics"] or "{}"))
    console.print("[bold]config[/]:", json.loads(row["config"] or "{}"))
    from serving.evaluation_table import describe

    evaluation = _evaluations(settings).get(version)
    shown = "none (SELECT * FROM evaluations)" if evaluation is None else describe(evaluation)
    if evaluation is not None:
        shown += f", {evaluation['source']}, {evaluation['evaluated_at']:%Y-%m-%d %H:%M:%S}"
    console.print(f"[bold]latest evaluation[/]: {shown}")
    console.print(f"[bold]viewer[/]: {settings.viewer.link(f'/versions/{version}')}")  # [viewer], or the stack's


@model_app.command()
@handle_errors
def fetch(version: str = typer.Argument(..., help="A version, e.g. v0003."), config: str | None = ConfigOption) -> None:
    """Put a version's files on this machine (from the lake's object store, every hash checked); print the folder."""
    from trainer.artifacts import local_copy
    from trainer.config import local_model_dir

    settings = settings_or_exit(config)
    row = _registry(settings).get(version)
    folder = local_copy(row, cache_dir=local_model_dir(settings), storage_options=dict(settings.lake.storage_options))
    console.print(f"[green]{version}[/] at {folder}")


@model_app.command()
@handle_errors
def publish(
    version: str | None = typer.Argument(None, help="Version to serve (default: the newest)."),
    vllm_url: str | None = typer.Option(None, "--vllm-url", help="vLLM base URL (default: from settings)."),
    eval_tasks: Path | None = EvalTasksOption,
    config: str | None = ConfigOption,
) -> None:
    """Hot-load a LoRA version into vLLM (or restart it on full weights) and announce it."""
    from serving.publish import gated_publisher

    settings = settings_or_exit(config)
    # the option's tasks, else the setting's
    pub = gated_publisher(settings, restart=_restart(settings), eval_tasks=eval_tasks, vllm_url=vllm_url)
    if version is None:
        rows = pub.registry.rows()
        if not rows:
            console.print("no policy versions to publish; run `agentlake train --once`")
            raise typer.Exit(1)
        version = rows[-1]["version"]
    result = pub.publish(version)
    colour = "green" if result.status == "published" else "yellow"
    name = pub.name_of(pub.registry.get(version))  # its policy line's served name
    console.print(f"[{colour}]{result.version} {result.status}[/] in {result.seconds:.2f}s as {name}")
    if result.scores:
        metrics = json.loads(pub.registry.get(version)["metrics"] or "{}")
        console.print(
            f"  eval: candidate {result.scores['candidate']:.3f}, serving {result.scores['serving']:.3f}; "
            f"difference {metrics.get('eval_diff', 0.0):+.3f} [{metrics.get('eval_diff_ci_low', 0.0):+.3f}, "
            f"{metrics.get('eval_diff_ci_high', 0.0):+.3f}]: {metrics.get('eval_verdict', '-')}"
        )
    if result.event_error:
        console.print(f"  [yellow]release event not sent:[/] {result.event_error}")
    _print_acks(result.acks)


def _print_acks(acks: dict[str, dict[str, Any]]) -> None:
    """One line per replica that acked a release through the bus (serving.replicas)."""
    for replica, ack in sorted(acks.items()):
        console.print(f"  {replica}: serving {ack['serving_version']} (loaded and checked in {ack['seconds']:.2f}s)")


@model_app.command()
@handle_errors
def rollback(
    to: str | None = typer.Option(None, "--to", help="Version to serve (default: the one served before)."),
    agent: str | None = typer.Option(None, "--agent", help="The agent's policy line (trainer.agents) to roll back."),
    vllm_url: str | None = typer.Option(None, "--vllm-url", help="vLLM base URL (default: from settings)."),
    config: str | None = ConfigOption,
) -> None:
    """Serve an earlier version again by re-loading its folder."""
    from serving.publish import Publisher

    settings = settings_or_exit(config)
    pub = Publisher.from_settings(settings, vllm_url=vllm_url, restart=_restart(settings))  # no gate to roll back
    result = pub.rollback(to, agent=agent)
    console.print(f"[green]serving {result.version}[/] again (was {result.previous}) in {result.seconds:.2f}s")
    _print_acks(result.acks)
