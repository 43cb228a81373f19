"""The main job on the embedded default: bring the stack up, push a round through it, take it down.

The round today is the smoke round (synthetic traces with token ids and rewards, no model): it
proves every hop of the data path on the real parts and leaves queryable tables behind. The
asset run goes through the same Dagster instance (``DAGSTER_HOME``) that `dagster dev` serves,
so it shows up in the UI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from agentlake.smoke import emit_synthetic_rollouts
from agentlake.stack import local
from schemas.config import Settings
from schemas.errors import AgentlakeError


@dataclass
class DemoReport:
    stack: list[local.PartStatus]
    rollouts_sent: int
    tables: pa.Table
    reward_by_task: pa.Table
    seconds: float


def materialize_all(
    settings: Settings, bootstrap: str, extra_env: dict[str, str] | None = None, *, select: str = "*"
) -> None:
    """Run pipeline assets (default: all) once through the Dagster instance the stack uses."""
    env = {**local.child_env(settings, bootstrap), **(extra_env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "pipelines.definitions", "--select", select],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd=local.REPO_ROOT,
        timeout=900,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        raise AgentlakeError(f"dagster asset materialize failed:\n{tail}")


def run_smoke_demo(settings: Settings, *, on_step: Callable[[str], None] = lambda _m: None) -> DemoReport:
    """up -> synthetic rollouts over OTLP -> Dagster assets -> DuckDB; the caller takes the stack down."""
    from pipelines.query import list_tables, run_query
    from schemas.lake import Lake

    started = time.monotonic()
    stack = local.up(settings, on_step=lambda part: on_step(f"starting {part}"))
    bootstrap = local.bootstrap_servers(settings)
    assert bootstrap is not None
    on_step("sending synthetic agent traces through OTLP/HTTP")
    rollouts = emit_synthetic_rollouts(settings)
    on_step("materializing spans -> rewards -> trajectories -> transitions in Dagster")
    materialize_all(settings, bootstrap)
    env = local.child_env(settings, bootstrap)  # the lake as the stack's children see it (object store or folder)
    lake = Lake(env["AGENTLAKE_LAKE"], json.loads(env["AGENTLAKE_LAKE__STORAGE_OPTIONS"]))
    infos = list_tables(lake)
    tables = pa.table(
        {
            "table": [i.name for i in infos],
            "rows": [i.rows for i in infos],
            "version": [i.version for i in infos],
        }
    )
    reward_by_task = run_query(
        lake,
        "SELECT task_id, count(*) AS rollouts, round(avg(final_reward), 3) AS mean_reward, "
        "sum(n_llm_calls) AS llm_calls FROM trajectories GROUP BY task_id ORDER BY task_id",
    )
    return DemoReport(stack, len(rollouts), tables, reward_by_task, time.monotonic() - started)
