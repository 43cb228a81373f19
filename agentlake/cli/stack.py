"""`agentlake up | status | down`: the local stack."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from agentlake.stack import local
from agentlake.stack.dagster import NO_POSTGRES_WARNING
from agentlake.stack.health import gateway_spill
from schemas.config import Settings
from schemas.config.stack_file import stack_file


class Profile(StrEnum):
    """`agentlake up --profile`: the values of ``dagster.profile``."""

    production = "production"
    dev = "dev"


ProfileOption = typer.Option(
    None,
    "--profile",
    help="Dagster's shape: production (PostgreSQL, webserver, daemon, code server) or dev (`dagster dev`). "
    "Default: dagster.profile.",
)


def _render(rows: list[local.PartStatus]) -> Table:
    table = Table(title="agentlake stack")
    for col in ("part", "address", "pid", "health", "detail"):
        table.add_column(col)
    for r in rows:
        health = "[green]healthy[/]" if r.healthy else ("[red]down[/]" if r.pid or r.name == "broker" else "-")
        if r.checked:  # a policy line: vLLM serves the registry's version, or not
            health = "[green]current[/]" if r.healthy else "[red]differs[/]"
        table.add_row(r.name, r.address, str(r.pid or "-"), health, r.detail)
    return table


@app.command()
@handle_errors
def up(
    vllm: bool = typer.Option(False, "--vllm", help="Also start vLLM (CPU or GPU build) and the gateway."),
    dagster: bool = typer.Option(True, "--dagster/--no-dagster", help="Start Dagster."),
    profile: Profile | None = ProfileOption,
    config: str | None = ConfigOption,
) -> None:
    """Start the local stack and wait until every part is healthy."""
    settings = settings_or_exit(config)
    if profile is not None:
        settings.dagster.profile = profile.value
    asked = settings.dagster.profile
    with console.status("starting") as spinner:
        rows = local.up(
            settings, with_vllm=vllm, with_dagster=dagster, on_step=lambda part: spinner.update(f"starting {part}")
        )
    console.print(_render(rows))
    if any(r.name == "broker" and "IN MEMORY" in r.detail for r in rows):
        console.print(f"[yellow]warning:[/] {local.NO_WEED_WARNING}")
    if dagster and asked == "production" and settings.dagster.profile == "dev":  # fell back: no PostgreSQL
        console.print(f"[yellow]warning:[/] {NO_POSTGRES_WARNING}")
    if any(r.name == "viewer" and r.healthy for r in rows):
        console.print(f"the viewer: {settings.viewer.link('/rollouts')}", soft_wrap=True)
    console.print(f"logs: {local.state_dir(settings) / 'logs'}   stop with: agentlake down")
    console.print(f"other tools find this stack through {stack_file(local.state_dir(settings))}")


@app.command()
@handle_errors
def status(config: str | None = ConfigOption) -> None:
    """Show each part of the stack, its address and health."""
    settings = settings_or_exit(config)
    rows = local.status(settings)
    g = settings.gateway
    spill = (
        gateway_spill(f"{g.url}/health", verify=not g.tls)  # our own process: alive, not trusted
        if any(r.name == "gateway" and r.healthy for r in rows)
        else None
    )
    rows = [replace(r, detail=f"{spill}; {r.detail}") if r.name == "gateway" and spill else r for r in rows]
    console.print(_render(rows))
    _print_replicas(settings)
    started = [r for r in rows if r.pid or r.checked]
    if started and not all(r.healthy for r in started):
        raise typer.Exit(1)


def _print_replicas(settings: Settings) -> None:
    """What each vLLM replica serves (its loader's last ack), when the release bus has been used."""
    from agentlake.cli.serving import served_table

    try:
        table = served_table(settings)
    except Exception as exc:  # the stack table above already says whether the lake's store is up
        console.print(f"[yellow]replicas: cannot read served_versions: {exc}[/]")
        return
    if table is not None:
        table.title = "replicas (served_versions)"
        console.print(table)
    elif settings.serving.replicas:
        console.print(f"replicas {', '.join(settings.serving.replicas)}: none has acked a release yet")


@app.command()
@handle_errors
def down(config: str | None = ConfigOption) -> None:
    """Stop exactly what `agentlake up` started."""
    settings = settings_or_exit(config)
    stopped = local.down(settings)
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
