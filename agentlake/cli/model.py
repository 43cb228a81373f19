"""`agentlake model ...`: base models on local disk.

``model_app`` is the sub-app every model command hangs on (``pull`` here; the registry's
commands join it from their own module), so it is importable on its own.
"""

from __future__ import annotations

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit

model_app = typer.Typer(name="model", help="Base models and policy versions.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command()
@handle_errors
def pull(
    source: str = typer.Argument(..., help="A known model name (smollm2-135m) or a Hugging Face model folder."),
    name: str | None = typer.Option(None, "--name", help="Name to register a folder under (default: its name)."),
    config: str | None = ConfigOption,
) -> None:
    """Fetch and convert a known model once, or register a local model folder as is."""
    from trainer.model_store import pull_model  # keeps `agentlake --help` free of the trainer

    settings = settings_or_exit(config)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"pulling {source}", total=None)

        def step(message: str) -> None:
            progress.console.print(f"  {message}")
            progress.update(task, description=message)

        entry = pull_model(source, settings.model.cache_dir, name=name, on_step=step)
    console.print(f"[green]{entry.name}[/] ({entry.kind}) at {entry.path}")
