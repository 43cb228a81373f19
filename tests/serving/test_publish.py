"""Publishing: registry status, release events on a real broker, failures that leave serving alone.

vLLM is played by a real HTTP server on a local port that speaks the three endpoints publishing
uses and answers with whatever status the test sets, so a refusal is a real 4xx/5xx over a real
socket. Unreachable vLLM is a port nobody listens on. The real vLLM is in test_e2e_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentlake.stack.ports import free_port
from schemas.config import Settings
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from serving.errors import PublishError
from serving.publish import Publisher
from tests.serving.helpers import FakeVllm
from tests.trainer.helpers import build_tokenizer, transition, write_transitions
from trainer.config import TrainConfig
from trainer.registry import Registry
from trainer.round import train_once


@pytest.fixture()
def two_versions(lake: Path, tiny_model_dir: Path) -> Registry:
    """Two real LoRA checkpoints (v0001, v0002) trained on the tiny model, both pending.

    ``lake`` is ``tmp_path / "lake"``, the same folder the ``settings`` fixture points at.
    """
    tok = build_tokenizer()
    prompt = tok("what is two plus three")["input_ids"]
    cfg = TrainConfig(
        lake_root=str(lake),
        base_model=str(tiny_model_dir),
        checkpoint_dir=str(lake / "models"),
        min_new_transitions=1,
        lora_rank=4,
        progress=False,
    )
    for v in range(2):
        new = range(2 * v, 2 * v + 2)  # new transitions each round: a trained one is never trained again
        write_transitions(lake, [transition(i, prompt, tok("good")["input_ids"], advantage=1.0) for i in new])
        assert train_once(cfg=cfg).version == f"v000{v + 1}"
    return Registry(Lake(str(lake)))


def _events(settings: Settings) -> list[dict[str, Any]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka_python_config(settings.kafka), enable_auto_commit=False)
    parts = [TopicPartition(settings.kafka.models_topic, p) for p in range(settings.kafka.partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    out: list[dict[str, Any]] = []
    for _ in range(10):
        for records in consumer.poll(timeout_ms=1000).values():
            out.extend(json.loads(r.value) for r in records)
        if out and not consumer.poll(timeout_ms=300):
            break
    consumer.close()
    return sorted(out, key=lambda e: e["timestamp"])


def _publisher(settings: Settings, url: str, registry: Registry) -> Publisher:
    # No gateway listens on this port: LoRA publishing never needs it, and its absence is tolerated.
    return Publisher(
        registry=registry,
        vllm_url=url,
        served_name="agentlake-policy",
        gateway_url=f"http://127.0.0.1:{free_port()}",
        kafka=settings.kafka,
    )


@pytest.mark.kafka
def test_publish_records_status_and_announces_it_then_rolls_back(
    settings: Settings, vllm: FakeVllm, two_versions: Registry
) -> None:
    reg = two_versions
    pub = _publisher(settings, vllm.url, reg)
    first = pub.publish("v0001")
    second = pub.publish("v0002")
    assert (first.status, second.status, second.previous) == ("published", "published", "v0001")
    assert reg.serving()["version"] == "v0002"
    assert vllm.requests[0] == (
        "/v1/load_lora_adapter",
        {"lora_name": "agentlake-policy", "lora_path": reg.get("v0001")["path"], "load_inplace": True},
    )

    back = pub.rollback()
    assert (back.version, back.previous) == ("v0001", "v0002")
    assert vllm.loads() == [reg.get(v)["path"] for v in ("v0001", "v0002", "v0001")]
    assert reg.serving()["version"] == "v0001"
    assert reg.get("v0002")["publish_status"] == "rolled_back"

    events = _events(settings)
    assert [(e["version"], e["status"]) for e in events] == [
        ("v0001", "published"),
        ("v0002", "published"),
        ("v0002", "rolled_back"),
    ]
    assert all(e["served_name"] == "agentlake-policy" and e["kind"] == "lora" for e in events)


@pytest.mark.slow  # a training round, then a refused publish: ~7 s
@pytest.mark.kafka
def test_failed_publish_is_recorded_and_serving_is_untouched(
    settings: Settings, vllm: FakeVllm, two_versions: Registry
) -> None:
    reg = two_versions
    pub = _publisher(settings, vllm.url, reg)
    pub.publish("v0001")
    vllm.load_status = 500  # vLLM refuses the next adapter
    with pytest.raises(PublishError, match="answered 500: .*boom"):
        pub.publish("v0002")
    row = reg.get("v0002")
    assert row["publish_status"] == "failed" and "boom" in row["publish_error"]
    assert reg.serving()["version"] == "v0001"
    # The only adapter vLLM accepted is v0001's; the attempt after the refusal re-loads it (also refused here).
    v1, v2 = reg.get("v0001")["path"], row["path"]
    assert vllm.loads() == [v1, v2, v1]
    events = _events(settings)
    assert [(e["version"], e["status"]) for e in events] == [("v0001", "published"), ("v0002", "failed")]
    assert "boom" in events[-1]["error"]


@pytest.mark.slow  # a training round, then vLLM's connect timeouts: ~6 s
def test_unreachable_vllm_is_a_recorded_failure(two_versions: Registry) -> None:
    # A port that was free a moment ago and that nobody listens on: connection refused.
    pub = Publisher(registry=two_versions, vllm_url=f"http://127.0.0.1:{free_port()}", served_name="p")
    with pytest.raises(PublishError, match="unreachable"):
        pub.publish("v0001")
    assert two_versions.get("v0001")["publish_status"] == "failed"
    assert two_versions.serving() is None


def test_base_model_name_would_shadow_the_adapter(vllm: FakeVllm, two_versions: Registry) -> None:
    pub = Publisher(registry=two_versions, vllm_url=vllm.url, served_name="base-model")
    with pytest.raises(PublishError, match="shadow"):
        pub.publish("v0001")
    assert vllm.loads() == []  # vLLM was never asked to change anything


def test_full_weights_need_a_managed_restart(two_versions: Registry, vllm: FakeVllm) -> None:
    calls: list[str] = []
    row = two_versions.get("v0001")
    two_versions.add(version="v0003", version_number=3, base_model=row["base_model"], kind="full", path=row["path"])
    with pytest.raises(PublishError, match="managed vLLM restart"):
        Publisher(registry=two_versions, vllm_url=vllm.url, served_name="p").publish("v0003")
    pub = Publisher(registry=two_versions, vllm_url=vllm.url, served_name="p", restart=calls.append)
    assert pub.publish("v0003").status == "published"
    assert calls == [row["path"]] and vllm.loads() == []
