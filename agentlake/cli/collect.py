"""`agentlake gateway pause | resume | state`: hold agents' LLM calls around a weight update."""

from __future__ import annotations

import httpx
import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from schemas.errors import AgentlakeError

gateway_app = typer.Typer(help="The OpenAI-compatible gateway: pause and resume traffic.", no_args_is_help=True)
app.add_typer(gateway_app, name="gateway")


def _call(config: str | None, method: str, path: str, **params: float) -> dict[str, object]:
    g = settings_or_exit(config).gateway
    url = f"{g.url}{path}"
    try:
        r = httpx.request(
            method, url, params=params or None, headers=g.admin_headers(), timeout=max(10.0, *params.values(), 0) + 5
        )
    except httpx.HTTPError as exc:
        raise AgentlakeError(f"the gateway at {url} does not answer ({exc}); is it up? see `agentlake status`") from exc
    if r.status_code != 200:
        raise AgentlakeError(f"the gateway answered {r.status_code}: {r.text[:200]}")
    return dict(r.json())


def _show(state: dict[str, object]) -> None:
    table = Table(title="gateway")
    for key in state:
        table.add_column(key)
    table.add_row(*(str(v) for v in state.values()))
    console.print(table)


@gateway_app.command()
@handle_errors
def pause(
    wait: float = typer.Option(30.0, min=0, help="Seconds to wait for in-flight calls to finish."),
    config: str | None = ConfigOption,
) -> None:
    """New calls get 429 with Retry-After; waits until in-flight calls have finished."""
    state = _call(config, "POST", "/admin/pause", wait=wait)
    _show(state)
    if state.get("idle") is False:
        console.print(f"[yellow]calls were still in flight after {wait:.0f}s[/]")
        raise typer.Exit(1)


@gateway_app.command()
@handle_errors
def resume(config: str | None = ConfigOption) -> None:
    """Accept calls again."""
    _show(_call(config, "POST", "/admin/resume"))


@gateway_app.command()
@handle_errors
def state(config: str | None = ConfigOption) -> None:
    """Paused or not, calls in flight, spans recorded."""
    _show(_call(config, "GET", "/admin/state"))
