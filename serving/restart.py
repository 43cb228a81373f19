"""Restart a vLLM on a full-weight folder with the user's own command (``vllm.restart_command``).

vLLM cannot swap its base weights in place, so a full-weight version is served by restarting it.
The CLI restarts the vLLM the local stack manages; anywhere else (the ``policy`` asset in Dagster, a
replica run by systemd or Kubernetes) only the deployment knows how, so it names the command. The
publisher pauses the gateway around the call and waits for vLLM's health afterwards.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence

from serving.errors import PublishError

FOLDER = "{folder}"


def command_restart(argv: Sequence[str], *, timeout_s: float = 900.0) -> Callable[[str], None] | None:
    """A restart callable for ``Publisher.restart`` running ``argv`` with ``{folder}`` filled in; None if empty."""
    if not argv:
        return None
    template = list(argv)
    if not any(FOLDER in a for a in template):
        raise PublishError(
            f"vllm.restart_command {shlex.join(template)!r} never names {FOLDER}: "
            "it must say which folder vLLM restarts on"
        )

    def restart(folder: str) -> None:
        cmd = [a.replace(FOLDER, folder) for a in template]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PublishError(f"restart command {shlex.join(cmd)!r} failed to run: {exc}") from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-500:]
            raise PublishError(f"restart command {shlex.join(cmd)!r} exited {done.returncode}: {tail}")

    return restart
