"""`agentlake ui`: the read-only trajectory viewer (``viewer``) over a lake, served by uvicorn.

`agentlake up` runs this same command as its ``viewer`` process. Without tokens configured every visitor
is the operator, so the viewer then refuses any host but loopback (the gateway's rule for anonymous calls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from agentlake.stack.viewer import is_loopback
from schemas.config import Settings
from schemas.errors import ConfigError

if TYPE_CHECKING:
    from schemas.lake import Lake


def viewer_lake(settings: Settings, lake: str | None) -> Lake:
    """``--lake`` (a folder, or a URI with the settings' storage options), else the settings' lake."""
    from schemas.lake import Lake  # the `stack` extra's: every command is registered, even with `serving` alone

    if lake is None:
        return Lake.from_settings(settings)
    return Lake(lake, dict(settings.lake.storage_options) if "://" in lake else {})


def check_host(settings: Settings, host: str) -> None:
    """Refuse a host other than loopback while no token is configured: anyone reaching it would be the operator."""
    from viewer.auth import must_bind_loopback

    if must_bind_loopback(settings) and not is_loopback(host):
        raise ConfigError(
            f"the viewer on {host} would show every tenant's rows without a token: set collector.auth_tokens "
            "(tenants) and gateway.admin_token (the operator), or bind viewer.host to 127.0.0.1"
        )


@app.command()
@handle_errors
def ui(
    lake: str | None = typer.Option(None, "--lake", help="A lake root, folder or URI (default: the settings' lake)."),
    port: int | None = typer.Option(None, "--port", help="Port (default: viewer.port; 0: a free one)."),
    host: str | None = typer.Option(None, "--host", help="Address to bind (default: viewer.host, loopback)."),
    config: str | None = ConfigOption,
) -> None:
    """Serve the trajectory viewer: rollouts, their tokens and rewards, model versions, health."""
    import uvicorn

    from viewer.app import create_app

    settings = settings_or_exit(config)
    bind = host if host is not None else settings.viewer.host
    check_host(settings, bind)
    the_lake = viewer_lake(settings, lake)
    listen = port if port is not None else settings.viewer.port
    console.print(f"viewer over {the_lake.root} on http://{bind}:{listen}/rollouts", soft_wrap=True)
    uvicorn.run(create_app(settings, the_lake), host=bind, port=listen, log_level="warning", access_log=False)
