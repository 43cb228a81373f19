"""Rollouts only the gateway sees, end to end: gateway -> real broker -> Dagster assets -> Delta.

Issue 14, finding 7. A client that names its rollout (``/rollout/{id}/`` path or header) but sends
no ``traceparent`` gets parent-less gateway spans; the pipeline took the first one for the
rollout's root and finished the rollout at its first call. And with ``n > 1`` every choice had the
same response id, so the pipeline kept one. The upstream is the in-process vLLM-shaped fake of
test_gateway.py (exact answers and token ids); everything after the gateway is real.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import polars as pl
import pytest
from dagster import materialize

from collectors.gateway.serve import GatewayServer
from pipelines.defs.assets import all_assets
from pipelines.defs.checks import all_checks
from pipelines.defs.resources import resources_from_settings
from schemas.config import Settings
from schemas.lake import Lake
from tests.collectors.helpers import LoopThread, wait_until
from tests.collectors.test_gateway import UPSTREAM, FakeVllm

pytestmark = pytest.mark.kafka
MSGS = [{"role": "user", "content": "2+2?"}]


@pytest.fixture()
def gateway(settings: Settings) -> Iterator[tuple[str, GatewayServer]]:
    settings.gateway.port = 0
    settings.gateway.upstreams = [UPSTREAM]
    lt = LoopThread()
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(FakeVllm().app()))
    server = GatewayServer(settings, client=upstream)
    lt.run(server.start())
    try:
        wait_until(lambda: server.sink.connected, 20, "the gateway's Kafka producer")  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{server.port}", server
    finally:
        lt.run(server.stop(), timeout=120)
        lt.close()


def materialize_all(settings: Settings) -> None:
    result = materialize([*all_assets, *all_checks], resources=resources_from_settings(settings))
    assert result.success


def table(settings: Settings, name: str) -> pl.DataFrame:
    return pl.read_delta(Lake(settings.lake.root).uri(name))


def chat(base: str, path: str = "/v1/chat/completions", **kw: object) -> None:
    headers = kw.pop("headers", {})
    r = httpx.post(f"{base}{path}", json={"model": "m", "messages": MSGS, **kw}, headers=headers, timeout=30)  # type: ignore[arg-type]
    assert r.status_code == 200, r.text


def test_gateway_only_rollouts_run_until_ended_and_keep_every_choice(
    settings: Settings, gateway: tuple[str, GatewayServer]
) -> None:
    base, server = gateway
    task = {"x-agentlake-task-id": "sum"}
    for _ in range(3):  # rollout named by path, three calls
        chat(base, "/rollout/gw-path/v1/chat/completions", headers=task)
    chat(base, n=2, headers={**task, "x-agentlake-rollout-id": "gw-n"})  # named by header, two choices
    chat(base)  # plain traffic, no rollout named: a rollout of one call, finished at once as before
    wait_until(lambda: server.gateway.recorder.recorded_spans == 6 and server.spill.records == 0, 20, "spans in Kafka")

    materialize_all(settings)
    traj = {r["rollout_id"]: r for r in table(settings, "trajectories").to_dicts()}
    assert len(traj) == 3
    assert traj["gw-path"]["status"] == "running" and traj["gw-path"]["n_llm_calls"] == 3
    assert traj["gw-n"]["status"] == "running" and traj["gw-n"]["n_llm_calls"] == 2
    (plain,) = [r for k, r in traj.items() if k not in ("gw-path", "gw-n")]
    assert plain["status"] == "finished" and plain["n_llm_calls"] == 1
    choices = sorted(c["completion_token_ids"] for c in traj["gw-n"]["calls"])
    assert choices == [[11, 12, 13], [21, 22, 23]]

    for rollout, reward in (("gw-path", 1.0), ("gw-n", 0.0)):
        r = httpx.post(f"{base}/rollout/{rollout}/end", json={"reward": reward}, timeout=30)
        assert r.status_code == 200, r.text
    wait_until(lambda: server.spill.records == 0 and server.gateway.recorder.recorded_spans == 8, 20, "ends in Kafka")

    materialize_all(settings)
    traj = {r["rollout_id"]: r for r in table(settings, "trajectories").to_dicts()}
    assert traj["gw-path"]["status"] == "finished" and traj["gw-path"]["n_llm_calls"] == 3
    assert traj["gw-path"]["final_reward"] == 1.0
    assert traj["gw-n"]["status"] == "finished" and traj["gw-n"]["n_llm_calls"] == 2
    assert traj["gw-n"]["final_reward"] == 0.0
    tr = table(settings, "transitions")
    per_rollout = dict(tr.group_by("rollout_id").len().iter_rows())
    assert per_rollout["gw-path"] == 3 and per_rollout["gw-n"] == 2
    gw_n = tr.filter(pl.col("rollout_id") == "gw-n")
    assert sorted(gw_n["response_ids"].to_list()) == [[11, 12, 13], [21, 22, 23]]
