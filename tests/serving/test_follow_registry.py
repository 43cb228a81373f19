"""Serving follows the registry (issue 26): the loader restores each line's serving version a vLLM lacks, the
gateway holds the policy names (503 + Retry-After) until it has, and `agentlake status` compares the two.

The fast tests run a real gateway on a socket (its upstream a port nothing listens on: a call it passes on is
502, one it holds is 503) and a real registry in a folder lake. The slow one uses the session's vLLM: it
loses its adapter through vLLM's own unload endpoint, which leaves it as a restarted vLLM is, and a loader
with no Kafka at all (``follow_registry`` alone) loads the registry's version again. The stack test
(tests/stack/test_serving_follows_registry.py) does the same across `agentlake down`/`up --vllm` and a killed vLLM.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agentlake.stack.ports import free_port
from collectors.gateway.serve import GatewayServer
from collectors.sink import MemorySink
from schemas.config import KafkaSettings, load_settings
from schemas.lake import Lake
from serving.gateway_pause import GATEWAY_HOLD, GATEWAY_PAUSE, GATEWAY_RELEASE, GATEWAY_RESUME, gateway_call
from serving.restore import LineServing, restore_commands
from tests.collectors.helpers import LoopThread
from trainer.artifacts import store_version
from trainer.registry import Registry

POLICY = "agentlake-policy"


@contextmanager
def running_gateway(tmp_path: Path, upstream: str, *, held: bool, served_name: str = POLICY) -> Iterator[str]:
    """A real gateway on a free port in front of ``upstream``, policy line ``planner``; yields its URL."""
    settings = load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "gw-state")},
            "model": {"served_name": served_name},
            "gateway": {"upstreams": [upstream], "port": 0, "hold_until_restored": held},
            "trainer": {"agents": ["planner"]},
        },
    )
    lt = LoopThread()
    server = GatewayServer(settings, MemorySink())
    lt.run(server.start())
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        lt.run(server.stop(), timeout=60)
        lt.close()


def chat(url: str, model: str, **headers: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def test_a_held_gateway_answers_policy_names_503_with_retry_after_until_released(tmp_path: Path) -> None:
    with running_gateway(tmp_path, f"http://127.0.0.1:{free_port()}", held=True) as url:
        assert httpx.get(f"{url}/health").json()["restoring"] is True
        held = chat(url, POLICY)
        assert held.status_code == 503 and held.headers["retry-after"] == "5", held.text
        assert held.json()["error"]["type"] == "unavailable"
        # a line's agent is routed to its line's name, which is held too; the base model is not held
        assert chat(url, POLICY, **{"x-agentlake-agent": "planner"}).status_code == 503
        assert chat(url, "agentlake-base").status_code == 502  # passed on to the (absent) upstream
        # the plain pause and resume of a full-weight restart leave the hold alone
        assert gateway_call(url, GATEWAY_PAUSE) and chat(url, "agentlake-base").status_code == 429
        assert gateway_call(url, GATEWAY_RESUME) and chat(url, POLICY).status_code == 503
        assert gateway_call(url, GATEWAY_RELEASE)
        assert httpx.get(f"{url}/health").json()["restoring"] is False
        assert chat(url, POLICY).status_code == 502  # let through
        assert gateway_call(url, GATEWAY_HOLD) and chat(url, POLICY).status_code == 503
    with running_gateway(tmp_path, f"http://127.0.0.1:{free_port()}", held=False) as url:
        assert chat(url, POLICY).status_code == 502  # a gateway without a loader never holds


def _add(reg: Registry, folder: Path, number: int, *, agent: str | None = None, kind: str = "lora") -> str:
    version = f"v{number:04d}"
    stored = store_version(folder, lake_root=reg.lake.root, version=version)
    reg.add(
        version=version,
        version_number=number,
        base_model="base",
        kind=kind,  # type: ignore[arg-type]
        path=str(folder),
        artifact_uri=stored.uri,
        manifest_sha256=stored.manifest_sha256,
        agent=agent,
    )
    return version


def test_restore_commands_are_each_lines_serving_version_full_weights_first(tmp_path: Path) -> None:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    reg = Registry(Lake(str(tmp_path / "lake")))
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    v1, v2 = _add(reg, folder, 1), _add(reg, folder, 2)
    v3, v4 = _add(reg, folder, 3, agent="planner"), _add(reg, folder, 4, agent="coder", kind="full")
    v5 = _add(reg, folder, 5)  # trained, never published
    for version, minute in ((v1, 1), (v2, 2), (v3, 1), (v4, 1)):
        reg.set_status(version, "published", published_at=t0 + dt.timedelta(minutes=minute))
    reg.set_status(v5, "failed", error="refused")
    commands = restore_commands(reg.rows(), POLICY)
    assert [(c["served_name"], c["version"], c["kind"]) for c in commands] == [
        (f"{POLICY}-coder", v4, "full"),
        (POLICY, v2, "lora"),
        (f"{POLICY}-planner", v3, "lora"),
    ]
    assert all(c["status"] == "release" and c["manifest_sha256"] and c["artifact_uri"] for c in commands)
    reg.set_status(v2, "rolled_back")  # the single policy's serving version is v1 again
    assert [c["version"] for c in restore_commands(reg.rows(), POLICY)] == [v4, v1, v3]


def test_a_line_is_current_when_vllm_serves_the_registrys_manifest() -> None:
    assert LineServing(POLICY, "v0002", "v0002", "a" * 64, "a" * 64).current
    assert not LineServing(POLICY, "v0002", None).current  # a vLLM that restarted
    assert not LineServing(POLICY, "v0002", "v0002", "a" * 64, "b" * 64).current  # same name, other files
    assert not LineServing(POLICY, None, "v0001").current  # serves what the registry does not publish
    assert LineServing(POLICY, "v0002", "v0002").current  # no manifest on this host: by name


@pytest.mark.slow
@pytest.mark.vllm
def test_a_loader_loads_the_registrys_version_a_vllm_lacks_while_the_gateway_holds_agents(
    vllm_server: object, object_store: object, tmp_path: Path
) -> None:
    from agentlake.stack.local import policy_status
    from serving.loader import Loader
    from serving.publish import Publisher
    from serving.restore import compare
    from serving.vllm_client import VllmClient
    from tests.fixtures_vllm import VllmServer
    from tests.objectstore import ObjectStore
    from tests.serving.test_release_bus import lora_line

    assert isinstance(vllm_server, VllmServer) and isinstance(object_store, ObjectStore)
    name = "agentlake-restore-policy"  # not the other tests' adapters
    line = lora_line(object_store, vllm_server.model_path, tmp_path, name)
    v1 = line.add(1, seed=5)
    Publisher(registry=line.reg, vllm_url=vllm_server.url, served_name=name, cache_dir=tmp_path / "pub").publish(v1)
    client = VllmClient(vllm_server.url)
    settings = load_settings(
        environ={},
        overrides={
            "vllm": {"port": int(vllm_server.url.rsplit(":", 1)[1])},
            "lake": {"root": line.reg.lake.root, "storage_options": object_store.storage_options},
            "model": {"served_name": name},
        },
    )
    try:
        [now] = compare(client, line.reg.rows(), name)
        assert now.current and now.serving == v1 and now.serving_sha256 == line.reg.get(v1)["manifest_sha256"]
        client.unload_lora(name)  # what a restarted vLLM serves: the base model alone
        [row] = policy_status(settings)
        assert (row.address, row.healthy) == (name, False) and row.detail == f"vLLM serves nothing; registry: {v1}"
        with running_gateway(tmp_path, vllm_server.url, held=True, served_name=name) as gw:
            assert chat(gw, name).status_code == 503
            loader = Loader(
                kafka=KafkaSettings(),  # unused: the registry alone says what to serve
                replica="local",
                vllm_url=vllm_server.url,
                cache_dir=tmp_path / "host" / "models",
                storage_options=object_store.storage_options,
                registry=line.reg.rows,
                served_name=name,
                gateway_url=gw,
            )
            [ack] = loader.follow_registry()
            assert ack["ok"] and ack["serving_version"] == v1, ack
            assert httpx.get(f"{gw}/health").json()["restoring"] is False
            assert chat(gw, name).status_code == 200
            assert loader.follow_registry() == []  # nothing lacking: nothing loaded again
        [row] = policy_status(settings)
        assert row.healthy and row.detail == f"vLLM serves {v1}; registry: {v1}"
    finally:
        if client.adapter_root(name) is not None:
            client.unload_lora(name)
        client.close()
