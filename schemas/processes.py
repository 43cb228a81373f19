"""Whether a process we recorded still runs: the one liveness check.

Below ``agentlake`` because settings loading needs it: any tool (``dagster asset materialize``, the
collector) finds the running local stack by checking the processes its file records.
"""

from __future__ import annotations

import os
from typing import Any


def process_alive(pid: Any, create_time: Any = None) -> bool:
    """True when ``pid`` runs and, given ``create_time``, started then (a recycled pid is not the same process).

    A zombie is not alive. ``pid`` and ``create_time`` come from files, so anything else is False.
    """
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency; a pid check is the fallback
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    try:
        proc = psutil.Process(pid)
        if isinstance(create_time, int | float) and abs(proc.create_time() - create_time) >= 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
