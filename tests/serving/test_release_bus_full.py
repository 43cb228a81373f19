"""Issue 12's full-weight rollout end to end: two real vLLM replicas restarted one at a time, a gateway paused.

Everything is real: two vLLM CPU servers (tests/fixtures_vllm.py), each with a loader whose restart command
(tests/serving/restart_vllm.py) stops its vLLM and starts it on a version folder on the same port; a
gateway in front of r1 that the loader pauses around the restart; the session's Kafka broker; the lake
and the version folders on a real S3 object store (SeaweedFS).

Versions: v0001 is SmolLM2's weights with seeded noise on the last layers' MLPs, saved in bf16 (greedy text
changes); v0002 the same files with one byte of config.json changed in the bucket (a corrupt upload);
v0003 a folder vLLM cannot start on (its weights file holds one tensor of a wrong name), stored intact.
The servers are put back on the base model at the end, so the session's other tests find them as before.

Before those, the LoRA path's failed first publish: a third replica never answers, so the two that loaded
the adapter are sent an unload and serve nothing under the name again.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from collectors.gateway.serve import GatewayServer
from schemas.config import Settings
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from schemas.storage import read_bytes, write_bytes
from schemas.uris import table_uri
from serving.errors import PublishError
from serving.loader import Loader, same_folder
from serving.publish import Publisher
from serving.restart import command_restart
from serving.served import served_now
from serving.vllm_client import VllmClient
from tests.collectors.helpers import LoopThread, wait_until
from tests.fixtures_vllm import VllmServer
from tests.objectstore import ObjectStore
from tests.serving.helpers import register_stored
from trainer.registry import Registry

PROMPT = "The capital of France is"
NAME = "agentlake-full-policy"  # the line's served name (a LoRA adapter's, in the unload test)
REPLICAS = ("r1", "r2")
RESTART = Path(__file__).with_name("restart_vllm.py")
ADMIN = "adm-full"


def _restart_argv(server: VllmServer) -> list[str]:
    """The replica's restart command: this server, on ``{folder}``, on its own port."""
    port = urlsplit(server.url).port
    return [sys.executable, str(RESTART), str(server.settings.state.dir), str(port), "{folder}"]


def _base(server: VllmServer) -> tuple[str, str]:
    client = VllmClient(server.url)
    try:
        base = client.base_model()
    finally:
        client.close()
    assert base is not None
    return base


@pytest.fixture()
def replicas(
    settings: Settings, vllm_server: VllmServer, vllm_server_b: VllmServer, object_store: ObjectStore, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """Loaders r1 and r2 with restart commands, a real gateway in front of r1; the servers go back to the
    base model at the end if a test moved them."""
    servers = dict(zip(REPLICAS, (vllm_server, vllm_server_b), strict=True))
    settings.gateway.port = 0
    settings.gateway.admin_token = ADMIN
    settings.gateway.upstreams = [vllm_server.url]
    lt = LoopThread()
    gateway = GatewayServer(settings)
    lt.run(gateway.start())
    wait_until(lambda: gateway.sink.connected, 20, "the gateway's Kafka producer")  # type: ignore[attr-defined]
    gateway_url = f"http://127.0.0.1:{gateway.port}"
    stop = threading.Event()
    acks: list[dict[str, Any]] = []
    threads = []
    for replica, server in servers.items():
        loader = Loader(
            kafka=settings.kafka,
            replica=replica,
            vllm_url=server.url,
            cache_dir=tmp_path / f"host-{replica}" / "models",
            storage_options=object_store.storage_options,
            resync_s=1.0,
            restart=command_restart(_restart_argv(server), timeout_s=400),
            restart_timeout_s=300,
            gateway_url=gateway_url if replica == "r1" else None,
            gateway_headers=settings.gateway.admin_headers(),
        )
        threads.append(threading.Thread(target=loader.run, args=(stop,), kwargs={"on_ack": acks.append}))
    for t in threads:
        t.start()
    try:
        yield {"servers": servers, "gateway": gateway, "gateway_url": gateway_url, "acks": acks}
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=400)
        lt.run(gateway.stop(), timeout=120)
        lt.close()
        for server in servers.values():
            httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": NAME}, timeout=30)
            if not same_folder(_base(server)[1], str(server.model_path)):  # a restart moved it: back to the base
                command_restart(_restart_argv(server), timeout_s=400)(str(server.model_path))  # type: ignore[misc]
    assert not any(t.is_alive() for t in threads)


def _add_full(reg: Registry, folder: Path, number: int) -> str:
    """A full-weight version of SmolLM2, stored in the registry's lake and registered."""
    return register_stored(reg, folder, number, kind="full", base_model="smollm2-135m")


def _registry(object_store: ObjectStore) -> tuple[Registry, str, dict[str, str]]:
    lake, opts = object_store.lake_root(), object_store.storage_options
    return Registry(Lake(lake, opts)), lake, opts


def _commands(settings: Settings) -> list[tuple[str, str, list[str], dt.datetime]]:
    """(status, version, targets, timestamp) of every command on the models topic, in log order."""
    from kafka import KafkaConsumer

    reader = Loader(kafka=settings.kafka, replica="reader", vllm_url="", cache_dir=Path("/nonexistent"))
    consumer = KafkaConsumer(**kafka_python_config(settings.kafka, role="consumer"), enable_auto_commit=False)
    try:
        reader._assign(consumer, threading.Event())
        events = reader._catch_up(consumer)
    finally:
        consumer.close()
    return [
        (e["status"], e["version"], e["targets"], e["timestamp"])
        for e in events
        if e["status"] in ("release", "unload")
    ]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.kafka
def test_a_failed_first_publish_unloads_the_adapter_where_it_was_loaded(
    settings: Settings, replicas: dict[str, Any], object_store: ObjectStore, vllm_server: VllmServer, tmp_path: Path
) -> None:
    from tests.serving.test_release_bus import lora_line

    line = lora_line(object_store, vllm_server.model_path, tmp_path, NAME)
    reg, v1 = line.reg, line.add(1, seed=2)
    pub = Publisher(
        registry=reg,
        vllm_url="",
        served_name=NAME,
        kafka=settings.kafka,
        replicas=(*REPLICAS, "ghost"),
        ack_timeout_s=15,
    )
    with pytest.raises(PublishError, match=f"{v1} was not published: replica ghost: no ack within 15s"):
        pub.publish(v1)
    assert reg.get(v1)["publish_status"] == "failed" and reg.serving() is None
    assert [(s, v, t) for s, v, t, _ in _commands(settings)] == [("release", v1, []), ("unload", v1, [])]
    mine = [a for a in replicas["acks"] if a["version"] == v1]
    assert len(mine) == 4 and {(a["replica"], a["serving_version"]) for a in mine} == {
        ("r1", v1),
        ("r1", None),
        ("r2", v1),
        ("r2", None),
    }
    assert all(a["ok"] for a in mine)
    for server in replicas["servers"].values():  # vLLM itself: no adapter under the name any more
        client = VllmClient(server.url)
        try:
            assert client.adapter_root(NAME) is None
        finally:
            client.close()
    assert {r["replica"]: r["serving_version"] for r in served_now(reg.lake)} == {"r1": None, "r2": None}


def _perturbed_copy(base: Path, dest: Path, *, seed: int) -> Path:
    """A full-weight version folder: the base model's files, the last four layers' MLPs plus seeded noise, bf16."""
    dest.mkdir(parents=True)
    for f in base.iterdir():
        if f.name != "model.safetensors":
            shutil.copy2(f, dest / f.name)
    weights = load_file(base / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    for name, w in weights.items():
        if any(f"layers.{i}.mlp" in name for i in range(26, 30)):
            w.add_(torch.randn(w.shape, generator=g) * 0.05)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, dest / "model.safetensors", {"format": "pt"}
    )
    return dest


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.kafka
def test_full_weights_roll_out_one_replica_at_a_time_and_a_bad_version_stops_at_the_first(
    settings: Settings, replicas: dict[str, Any], object_store: ObjectStore, vllm_server: VllmServer, tmp_path: Path
) -> None:
    reg, _, opts = _registry(object_store)
    servers: dict[str, VllmServer] = replicas["servers"]
    clients = {r: VllmClient(s.url) for r, s in servers.items()}
    base_name = _base(vllm_server)[0]

    def texts() -> dict[str, str]:
        return {r: c.complete(base_name, PROMPT, max_tokens=8) for r, c in clients.items()}

    host = tmp_path / "trainer-host" / "models"
    v1 = _add_full(reg, _perturbed_copy(vllm_server.model_path, host / "v0001", seed=7), 1)
    pub = Publisher(
        registry=reg, vllm_url="", served_name=NAME, kafka=settings.kafka, replicas=REPLICAS, ack_timeout_s=400
    )
    base_text = texts()
    assert base_text["r1"] == base_text["r2"]

    # agents keep calling r1 through its gateway during the rollout: they see 429 + Retry-After, never an error
    codes: list[tuple[int, str | None]] = []
    calling = threading.Event()

    def r1_done() -> bool:
        return any(a["replica"] == "r1" and a["version"] == v1 for a in replicas["acks"])

    def agent() -> None:
        """Calls r1 through its gateway until r1 acked (then r1 is left idle: two vLLMs share these 2 cores)."""
        body = {"model": base_name, "prompt": PROMPT, "max_tokens": 2}
        while not calling.is_set() and not r1_done():
            try:
                r = httpx.post(f"{replicas['gateway_url']}/v1/completions", json=body, timeout=60)
                codes.append((r.status_code, r.headers.get("retry-after")))
            except httpx.HTTPError as exc:
                codes.append((0, str(exc)))
            time.sleep(0.5)

    caller = threading.Thread(target=agent)
    caller.start()
    t0 = time.perf_counter()
    try:
        result = pub.publish(v1)
    finally:
        calling.set()
        caller.join(timeout=120)
    rollout_s = time.perf_counter() - t0
    assert result.status == "published" and set(result.acks) == set(REPLICAS)
    sha = reg.get(v1)["manifest_sha256"]
    for replica, ack in result.acks.items():
        assert ack["ok"] and ack["serving_version"] == v1 and ack["serving_sha256"] == sha, ack
        root = _base(servers[replica])[1]
        assert Path(root).name == v1 and Path(root).is_relative_to(tmp_path / f"host-{replica}")
    # one at a time: r2's command went out after r1 acked, and r1's ack came before r2's
    commands = _commands(settings)
    assert [(s, v, t) for s, v, t, _ in commands] == [("release", v1, ["r1"]), ("release", v1, ["r2"])]
    assert result.acks["r1"]["timestamp"] <= commands[1][3] <= result.acks["r2"]["timestamp"]
    v1_text = texts()
    assert v1_text["r1"] == v1_text["r2"] != base_text["r1"], (base_text, v1_text)
    assert {c for c, _ in codes} <= {200, 429}, codes
    assert any(c == 429 and retry for c, retry in codes), codes  # r1's restart happened behind the pause
    assert not replicas["gateway"].gateway.paused
    per = {r: a["seconds"] for r, a in result.acks.items()}
    print(f"\nfull-weight rollout to 2 replicas: {rollout_s:.1f}s; each replica's restart and checks: {per}")

    # v0002: v0001's files, one byte of config.json changed in the bucket: r1 refuses it, r2 never hears of it
    v2 = _add_full(reg, _linked_copy(host / "v0001", host / "v0002"), 2)
    stored = table_uri(reg.get(v2)["artifact_uri"], "config.json")
    data = bytearray(read_bytes(stored, opts) or b"")
    data[len(data) // 2] ^= 0x01
    write_bytes(stored, bytes(data), opts)
    with pytest.raises(PublishError, match=f"{v2} was not published: replica r1: .*does not match"):
        pub.publish(v2)
    row = reg.get(v2)
    assert (
        row["publish_status"] == "failed"
        and "replica r2: not sent: the rollout stopped at replica r1" in row["publish_error"]
    ), row["publish_error"]
    after_v2 = [(s, v, t) for s, v, t, _ in _commands(settings)[2:]]
    assert after_v2 == [("release", v2, ["r1"]), ("release", v1, ["r1"])]  # r1 confirms v1; r2: nothing
    assert reg.serving()["version"] == v1 and texts() == v1_text

    # v0003: stored intact, but vLLM cannot start on it: r1 restarts on v0001 again and says why
    v3 = _add_full(reg, _unstartable(vllm_server.model_path, host / "v0003"), 3)
    with pytest.raises(PublishError, match=f"{v3} was not published: replica r1: .*exited 1"):
        pub.publish(v3)
    assert "replica r2: not sent" in reg.get(v3)["publish_error"]
    last = [a for a in replicas["acks"] if a["version"] == v3]
    assert [(a["replica"], a["ok"], a["serving_version"], a["serving_sha256"]) for a in last] == [
        ("r1", False, v1, sha)
    ]
    assert _base(servers["r1"])[1].endswith(f"/{v1}") and texts() == v1_text
    assert [v for _, v, t, _ in _commands(settings)[4:]] == [v3, v1] and all(
        t == ["r1"] for _, _, t, _ in _commands(settings)[4:]
    )
    for c in clients.values():
        c.close()


def _linked_copy(src: Path, dest: Path) -> Path:
    """Another version folder with the same files (hard links: no second copy of the weights on disk)."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        (dest / f.name).hardlink_to(f)
    return dest


def _unstartable(base: Path, dest: Path) -> Path:
    """A folder with the base model's config and tokenizer but weights of the wrong name: vLLM refuses it."""
    dest.mkdir(parents=True)
    for f in base.iterdir():
        if f.name != "model.safetensors":
            shutil.copy2(f, dest / f.name)
    save_file({"not.a.llama.weight": torch.zeros(4)}, dest / "model.safetensors", {"format": "pt"})
    return dest
