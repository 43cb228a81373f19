"""The root typer app, the shared rich console, and error rendering."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from schemas.config import Settings, load_settings
from schemas.errors import AgentlakeError

app = typer.Typer(
    name="agentlake",
    help="Reinforcement learning for LLM agents, from the traces they already emit.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def settings_or_exit(config: str | None = None) -> Settings:
    """Load settings, turning a ConfigError into a clear message and exit code 2."""
    try:
        return load_settings(config)
    except AgentlakeError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def handle_errors(fn: F) -> F:
    """Render AgentlakeError as one red line and exit 1, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AgentlakeError as exc:
            err_console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(1) from exc

    return wrapper  # type: ignore[return-value]


ConfigOption = typer.Option(None, "--config", "-c", help="Path to agentlake.toml (default: ./agentlake.toml).")
