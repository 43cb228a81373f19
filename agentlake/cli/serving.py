"""`agentlake loader` (one per vLLM replica) and `agentlake model served`: the release bus from the CLI."""

from __future__ import annotations

import signal
import threading
from typing import Any

import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from agentlake.cli.model import model_app
from schemas.config import Settings


@app.command()
@handle_errors
def loader(
    replica: str | None = typer.Option(None, "--replica", help="Its name in acks (default: serving.replica)."),
    vllm_url: str | None = typer.Option(None, "--vllm-url", help="The vLLM beside it (default: serving.vllm_url)."),
    restart_command: str | None = typer.Option(
        None,
        "--restart-command",
        help="Full-weight versions: a shell-quoted command with {folder} that restarts this vLLM on that folder "
        "and returns once it runs (default: serving.restart_command; none: full-weight versions are refused).",
    ),
    gateway_url: str | None = typer.Option(
        None, "--gateway-url", help="The gateway in front of this vLLM, paused around a restart (serving.gateway_url)."
    ),
    config: str | None = ConfigOption,
) -> None:
    """Serve what the release bus asks: load released adapters (or restart on full weights) and ack each."""
    import shlex

    from serving.loader import Loader

    settings = settings_or_exit(config)
    argv = shlex.split(restart_command) if restart_command else None
    worker = Loader.from_settings(
        settings, replica=replica, vllm_url=vllm_url, restart_command=argv, gateway_url=gateway_url
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def show(ack: dict[str, Any]) -> None:
        if ack.get("eval_candidate") is not None:  # an evaluate command (the canary): scored, nothing served changed
            console.print(
                f"[cyan]{ack['version']} scored[/] {ack['eval_candidate']:.3f} vs {ack['serving_version'] or 'base'} "
                f"{ack['eval_serving']:.3f} on {ack['eval_task_count']} tasks in {ack['seconds']:.2f}s"
            )
        elif ack["ok"]:
            console.print(f"[green]{ack['served_name']} = {ack['version']}[/] in {ack['seconds']:.2f}s")
        else:
            console.print(f"[red]{ack['version']} refused:[/] {ack['error']} (serving {ack['serving_version']})")

    console.print(f"loader {worker.replica}: vLLM {worker.vllm_url}, topic {settings.kafka.models_topic}")
    if worker.restart is None:
        console.print("  no restart command: full-weight versions will be refused (serving.restart_command)")
    try:
        worker.run(stop, on_ack=show)
    except KeyboardInterrupt:
        stop.set()


def served_table(settings: Settings) -> Table | None:
    """What each replica serves, from ``served_versions``, next to what the registry publishes under that
    name; None when no replica has acked yet."""
    from schemas.lake import Lake
    from serving.served import against_registry, served_now
    from trainer.registry import Registry

    lake = Lake.from_settings(settings)
    rows = served_now(lake)
    if not rows:
        return None
    verdicts = against_registry(rows, Registry(lake).rows(), settings.model.served_name)
    table = Table("replica", "served name", "serving", "sha256", "registry", "last release", "acked (UTC)")
    for r in rows:
        last = f"{r['version']} ok" if r["ok"] else f"[red]{r['version']} failed[/]: {r['error']}"
        verdict = verdicts[(r["replica"], r["served_name"])]
        table.add_row(
            r["replica"],
            r["served_name"],
            r["serving_version"] or "-",
            (r["serving_sha256"] or "-")[:12],
            "[green]current[/]" if verdict == "current" else f"[yellow]{verdict}[/]",
            last,
            r["timestamp"].strftime("%H:%M:%S"),
        )
    return table


@model_app.command()
@handle_errors
def served(config: str | None = ConfigOption) -> None:
    """What each vLLM replica serves, as its loader last acked (the served_versions table)."""
    settings = settings_or_exit(config)
    table = served_table(settings)
    if table is not None:
        console.print(table)
        return
    if settings.serving.replicas:
        console.print("no replica has acked a release yet (no publish since)")
        return
    from agentlake.stack.local import policy_status  # one vLLM: ask it, next to the registry

    rows = policy_status(settings)
    if not rows:
        console.print("no replica has acked a release yet (serving.replicas empty, or no publish since)")
        return
    lines = Table("served name", f"vLLM ({settings.vllm.url}) and the registry", "verdict")
    for row in rows:
        lines.add_row(row.address, row.detail, "[green]current[/]" if row.healthy else "[red]differs[/]")
    console.print(lines)
