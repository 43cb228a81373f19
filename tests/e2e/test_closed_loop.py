"""One short round of the closed loop on the real parts: Tansu, collector, Dagster, vLLM CPU, gateway."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentlake.stack import local
from agentlake.stack.ports import free_port
from examples.closed_loop.loop import LoopPlan, run_closed_loop
from schemas.config import load_settings

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]


def test_one_round_trains_publishes_and_serves_the_new_version(tmp_path: Path, monkeypatch) -> None:
    for key in [k for k in os.environ if k.startswith("AGENTLAKE_") or k == "KAFKA_BOOTSTRAP_SERVERS"]:
        monkeypatch.delenv(key)
    settings = load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "lake": {"root": str(tmp_path / "lake")},
            "model": {"cache_dir": str(REPO / ".agentlake/models")},
            "vllm": {"venv": str(REPO / ".venv-vllm"), "port": free_port()},
            "collector": {"http_port": free_port(), "grpc_port": free_port()},
            "gateway": {"port": free_port()},
            "dagster": {"port": free_port()},
            "trainer": {"max_seq_len": 512},
        },
    )
    try:
        report = run_closed_loop(settings, LoopPlan(rounds=1, tasks_per_round=2, samples_per_task=2, eval_tasks=2))
        from pipelines.query import list_tables, run_query
        from schemas.lake import Lake
        from trainer.registry import Registry

        rows = {t.name: t.rows for t in list_tables(Lake(settings.lake.root))}
        assert rows["spans"] > 0 and rows["trajectories"] >= 4 and rows["transitions"] >= 4, rows
        [record] = report.rounds
        assert record.policy_version == "v0001" and record.trained_version == "v0002"
        registry = Registry(Lake(settings.lake.root))
        assert registry.serving()["version"] == "v0002"
        assert registry.get("v0002")["parent_version"] == "v0001"

        # The agent's next calls are served by the new version, as the gateway records it.
        import agentlake
        from examples.math_agent.agent import run_batch
        from examples.math_agent.tasks import make_tasks

        gateway = f"http://{settings.gateway.host}:{settings.gateway.port}"
        run_batch(gateway, make_tasks(1, seed=99, prefix="after"), model=settings.model.served_name)
        agentlake.flush()
        from examples.closed_loop.assets import materialize_all

        materialize_all(settings, local.bootstrap_servers(settings) or "", select="spans")
        versions = (
            run_query(
                Lake(settings.lake.root),
                "SELECT DISTINCT policy_version FROM spans WHERE policy_version IS NOT NULL AND rollout_id IN "
                "(SELECT rollout_id FROM spans WHERE task_id LIKE 'after-%')",
            )
            .column("policy_version")
            .to_pylist()
        )
        assert versions and all(v.endswith("@v0002") for v in versions), versions
        assert Path(report.plot).exists()
    finally:
        local.down(settings)
