"""The `agentlake` command line: one typer app, commands grouped by module.

Each module below adds its commands to ``app`` (or to a sub-app it owns) when imported.
Commands stay thin: they parse options, call into the packages, and render with rich.
"""

from __future__ import annotations

from agentlake.cli import collect as _collect  # noqa: E402,F401
from agentlake.cli import demo as _demo  # noqa: E402,F401
from agentlake.cli import forget as _forget  # noqa: E402,F401

# Importing a command module registers its commands on `app`.
from agentlake.cli import lake as _lake  # noqa: E402,F401
from agentlake.cli import model as _model  # noqa: E402,F401
from agentlake.cli import registry as _registry  # noqa: E402,F401
from agentlake.cli import serving as _serving  # noqa: E402,F401
from agentlake.cli import stack as _stack  # noqa: E402,F401
from agentlake.cli import train as _train  # noqa: E402,F401
from agentlake.cli import transitions as _transitions  # noqa: E402,F401
from agentlake.cli import ui as _ui  # noqa: E402,F401
from agentlake.cli.app import app, console

__all__ = ["app", "console"]
