"""Launch pipeline assets once, through the Dagster instance the local stack runs.

The run goes through the same instance (``DAGSTER_HOME``) that `dagster dev` serves, so it shows
up in the UI next to the runs the sensors start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from agentlake.stack import local
from schemas.config import Settings
from schemas.errors import AgentlakeError


def materialize_all(
    settings: Settings, bootstrap: str, extra_env: dict[str, str] | None = None, *, select: str = "*"
) -> None:
    """Run pipeline assets (default: all) once through the Dagster instance the stack uses."""
    env = {**local.child_env(settings, bootstrap), **(extra_env or {})}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dagster",
            "asset",
            "materialize",
            "-m",
            "pipelines.defs.definitions",
            "--select",
            select,
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd=local.REPO_ROOT,
        timeout=900,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        raise AgentlakeError(f"dagster asset materialize --select {select} {_exit(result.returncode)}:\n{tail}")


def _exit(code: int) -> str:
    """How the process ended, in words: a signal's name (SIGKILL, with nothing printed: most often the kernel's
    out-of-memory killer) or the exit status."""
    if code >= 0:
        return f"failed with exit status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = " (the kernel's out-of-memory killer sends it; see `dmesg`)" if -code == signal.SIGKILL else ""
    return f"was killed by {name}{hint}"
