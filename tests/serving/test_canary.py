"""The eval gate through the release bus, without vLLM: the evaluate command and its ack, and what the publisher
makes of a canary that fails or says nothing.

A real broker (the session's Tansu) carries commands and acks, and a real lake folder holds the registry and the
stored adapter. Where the canary's vLLM must fail, its loader points at a port nobody listens on: a real refused
connection. The canary against a real vLLM is in test_canary_vllm.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentlake.stack.ports import free_port
from schemas import topics
from schemas.config import Settings
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from schemas.tables import MODEL_RELEASE_ACK, MODEL_RELEASE_EVENT, schema_version
from schemas.validation import validate_record
from serving.canary import EVALUATE, MAX_TASKS_BYTES, ask_canary, evaluate, evaluate_command, evaluates_here
from serving.errors import PublishError
from serving.eval_gate import EvalTask, GateScores, candidate_name, worse
from serving.loader import Loader, Served, build_ack, latest_releases, targets_me
from serving.publish import Publisher
from serving.release_bus import release
from serving.releases import encode, release_command, send_release_event
from serving.served import served_now
from serving.vllm_client import VllmClient
from tests.serving.helpers import register_stored
from trainer.registry import Registry

TASKS = [EvalTask("2+2=", "4"), EvalTask('Say "hi":', "hi")]


def _row(version: str = "v0002", *, kind: str = "lora", uri: str | None = "s3://b/lake/models/x") -> dict[str, Any]:
    return {
        "version": version,
        "base_model": "base",
        "kind": kind,
        "path": f"/trainer/{version}",
        "parent_version": "v0001",
        "artifact_uri": uri,
        "manifest_sha256": "a" * 64 if uri else None,
    }


def _wire(record: dict[str, Any], schema: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``record`` as a consumer reads it back: its JSON value decoded and validated, and its headers."""
    value, headers = encode(record, schema)
    return validate_record(json.loads(value), schema), dict(headers)


def test_an_evaluate_command_carries_its_tasks_to_the_canary_only() -> None:
    cmd = evaluate_command(_row(), served_name="p", tasks=TASKS, canary="r2")
    back, headers = _wire(cmd, MODEL_RELEASE_EVENT)
    assert back == cmd
    assert back["status"] == EVALUATE and back["targets"] == ["r2"] and back["release_id"]
    assert back["eval_tasks"] == [{"prompt": "2+2=", "answer": "4"}, {"prompt": 'Say "hi":', "answer": "hi"}]
    assert (back["artifact_uri"], back["manifest_sha256"]) == ("s3://b/lake/models/x", "a" * 64)
    assert headers[topics.HEADER_SCHEMA_VERSION] == str(schema_version(MODEL_RELEASE_EVENT)).encode() == b"4"
    assert evaluates_here(back, "r2") and not evaluates_here(back, "r1")
    assert not evaluates_here(release_command(_row(), served_name="p", targets=["r2"]), "r2")  # a release
    assert not evaluates_here({**back, "targets": []}, "r2")  # never a broadcast
    # not a release: a loader neither carries it out as one nor replays it on start or resync
    assert not targets_me(back, "r2")
    release = release_command(_row("v0001"), served_name="p")
    assert {n: e["version"] for n, e in latest_releases([release, back], "r2").items()} == {"p": "v0001"}


def test_an_evaluate_command_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(PublishError, match="full-weight version; a canary evaluates LoRA adapters only"):
        evaluate_command(_row(kind="full"), served_name="p", tasks=TASKS, canary="r1")
    with pytest.raises(PublishError, match="no stored artifact for the canary to fetch"):
        evaluate_command(_row(uri=None), served_name="p", tasks=TASKS, canary="r1")
    with pytest.raises(PublishError, match="at least one eval task"):
        evaluate_command(_row(), served_name="p", tasks=[], canary="r1")
    big = [EvalTask("x" * 1000, "y")] * 300  # about 300 kB of JSON
    with pytest.raises(
        PublishError, match=rf"the 300 eval tasks take \d+ bytes .* allows {MAX_TASKS_BYTES}: keep fewer"
    ):
        evaluate_command(_row(), served_name="p", tasks=big, canary="r1")
    fits = [EvalTask("x" * 1000, "y")] * 200
    assert len(evaluate_command(_row(), served_name="p", tasks=fits, canary="r1")["eval_tasks"]) == 200


def test_older_records_read_with_the_new_fields_null() -> None:
    """v2 commands and v1 acks (no eval fields) still validate; the fields come back null."""
    old_cmd = release_command(_row(), served_name="p")
    del old_cmd["eval_tasks"]
    v2, _ = _wire(old_cmd, MODEL_RELEASE_EVENT)
    assert v2["eval_tasks"] is None and targets_me(v2, "r1") and not evaluates_here(v2, "r1")
    ack = build_ack(old_cmd, "r1", error=None, served=Served("/c/v0001", "v0001", "b" * 64), seconds=0.1)
    v1 = {k: v for k, v in ack.items() if not k.startswith("eval_")}
    read, headers = _wire(v1, MODEL_RELEASE_ACK)
    assert (read["eval_candidate"], read["eval_serving"], read["eval_task_count"]) == (None, None, None)
    assert headers[topics.HEADER_SCHEMA_VERSION] == b"3"
    v2_scored = {**v1, "eval_candidate": 0.5, "eval_serving": 1.0, "eval_task_count": 2}  # no per-task scores
    read = _wire(v2_scored, MODEL_RELEASE_ACK)[0]
    assert (read["eval_candidate_scores"], read["eval_serving_scores"]) == (None, None)
    scored = {**v2_scored, "eval_candidate_scores": [0.0, 1.0], "eval_serving_scores": [1.0, 1.0]}
    assert _wire(scored, MODEL_RELEASE_ACK)[0] == scored


def test_the_gate_rule_is_one_rule() -> None:
    """Both gates reject on the paired bootstrap (serving.evaluation): worse beyond noise, not a lower mean."""
    assert candidate_name("agentlake-policy-planner", "v0007") == "agentlake-policy-planner-candidate-v0007"
    assert worse(GateScores([0.0] * 20, [1.0] * 20))  # every task lost: worse beyond noise
    assert worse(GateScores([0.0], [1.0]))  # one task, lost: the interval is that one difference
    assert not worse(GateScores([0.5] * 4, [0.5] * 4))  # a tie publishes
    one_lost = GateScores([0.0] + [1.0] * 19, [1.0] * 20)  # 0.95 vs 1.0: a lower mean, within noise
    assert one_lost.means() == {"candidate": 0.95, "serving": 1.0}
    assert one_lost.paired().verdict == "within noise" and not worse(one_lost)
    assert worse(one_lost, confidence=0.0)  # serving.eval_gate_confidence = 0: any lower mean is rejected
    five_lost = GateScores([0.0] * 5 + [1.0] * 15, [1.0] * 20)  # 0.75 vs 1.0 on 20 tasks: beyond noise
    assert worse(five_lost) and worse(five_lost, confidence=0.99)


@pytest.fixture()
def registry(tmp_path: Path) -> Registry:
    """A lake folder whose registry holds v0001, a stored folder the canary can fetch and verify."""
    folder = tmp_path / "trainer" / "v0001"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    reg = Registry(Lake(str(tmp_path / "lake")))
    register_stored(reg, folder, 1)
    return reg


@contextmanager
def _dead_loader(settings: Settings, tmp_path: Path) -> Iterator[tuple[Loader, list[dict[str, Any]]]]:
    """Loader ``r1`` running in a thread, its vLLM a port nobody listens on; the list collects the acks it sends."""
    acks: list[dict[str, Any]] = []
    stop = threading.Event()
    dead = f"http://127.0.0.1:{free_port()}"
    loader = Loader(kafka=settings.kafka, replica="r1", vllm_url=dead, cache_dir=tmp_path / "r1", timeout_s=5)
    thread = threading.Thread(target=loader.run, args=(stop,), kwargs={"on_ack": acks.append})
    thread.start()
    try:
        yield loader, acks
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.fixture()
def dead_canary(settings: Settings, tmp_path: Path) -> Iterator[tuple[Loader, list[dict[str, Any]]]]:
    """A dead loader past its catch-up (an evaluate command that comes during it is not answered): a release
    under another name was acked."""
    with _dead_loader(settings, tmp_path) as (loader, acks):
        warm_up = release_command(_row(), served_name="warm-up")
        assert "r1" in release(settings.kafka, warm_up, ["r1"], timeout_s=30).acks
        acks.clear()
        yield loader, acks


def _models_topic(settings: Settings) -> list[dict[str, Any]]:
    """Every record on the settings' models topic, validated."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka_python_config(settings.kafka, role="consumer"), enable_auto_commit=False)
    try:
        tps = [
            TopicPartition(settings.kafka.models_topic, p)
            for p in consumer.partitions_for_topic(settings.kafka.models_topic)
        ]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out, empty = [], 0
        while empty < 2:
            batch = [r for rs in consumer.poll(timeout_ms=1000).values() for r in rs]
            empty = 0 if batch else empty + 1
            out += [validate_record(json.loads(r.value), MODEL_RELEASE_EVENT) for r in batch]
        return out
    finally:
        consumer.close()


@pytest.mark.kafka
def test_a_canary_that_fails_fails_the_publish_and_nothing_is_released(
    settings: Settings, registry: Registry, dead_canary: tuple[Loader, list[dict[str, Any]]]
) -> None:
    loader, acks = dead_canary
    pub = Publisher(
        registry=registry,
        vllm_url="",
        served_name="p",
        kafka=settings.kafka,
        replicas=("r1", "r2"),
        eval_tasks=TASKS,
        ack_timeout_s=20,
    )
    with pytest.raises(
        PublishError, match=r"v0001 was not published: canary r1 could not evaluate v0001: .*unreachable"
    ):
        pub.publish("v0001")
    row = registry.get("v0001")
    assert row["publish_status"] == "failed" and "canary r1 could not evaluate" in row["publish_error"]
    assert not any(k.startswith("eval_") for k in json.loads(row["metrics"]))  # no scores to record
    (ack,) = acks
    assert not ack["ok"] and ack["eval_candidate"] is None and ack["version"] == "v0001"
    on_p = [e["status"] for e in _models_topic(settings) if e["served_name"] == "p"]
    assert on_p == [EVALUATE, "failed"]  # no release went out
    assert served_now(registry.lake) == []  # an evaluate ack is not a release ack
    assert set(loader._latest) == {"warm-up"}  # and the loader keeps nothing of it to re-apply on resync


@pytest.mark.kafka
def test_a_silent_canary_is_named_after_the_ack_timeout(settings: Settings, registry: Registry) -> None:
    t0 = time.monotonic()
    verdict = ask_canary(
        settings.kafka, registry.get("v0001"), served_name="p", tasks=TASKS, canary="gpu-z", timeout_s=3
    )
    assert time.monotonic() - t0 >= 3
    assert verdict.scores is None and verdict.ack is None and verdict.tasks == 2
    assert verdict.error.startswith(
        "canary gpu-z did not answer the evaluate command within 3s (is its loader running?"
    )
    assert ask_canary(None, registry.get("v0001"), served_name="p", tasks=TASKS, canary="r1", timeout_s=3).error == (
        "canary r1: serving.replicas is set but no Kafka is configured: the release bus runs on Kafka"
    )


@pytest.mark.kafka
def test_a_loader_starting_late_does_not_answer_an_old_evaluate_command(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    """On start it replays releases only: the evaluate command before it in the log gets no ack."""
    row = registry.get("v0001")
    assert send_release_event(settings.kafka, evaluate_command(row, served_name="p", tasks=TASKS, canary="r1")) is None
    release = release_command(row, served_name="p")
    assert send_release_event(settings.kafka, release) is None
    with _dead_loader(settings, tmp_path) as (_, acks):
        deadline = time.monotonic() + 30
        while not acks and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # room for a wrong second ack
    assert [a["release_id"] for a in acks] == [release["release_id"]]


def test_the_canary_refuses_a_command_it_cannot_score_before_fetching_anything() -> None:
    dead = VllmClient(f"http://127.0.0.1:{free_port()}", timeout_s=5)

    def fetch(event: Mapping[str, Any]) -> str:
        raise AssertionError("nothing is fetched for a command that cannot be scored")

    try:
        cmd = evaluate_command(_row(), served_name="p", tasks=TASKS, canary="r1")
        assert evaluate(dead, {**cmd, "eval_tasks": None}, fetch) == (
            "the evaluate command for v0002 carries no eval task",
            {},
        )
        error, scores = evaluate(dead, {**cmd, "kind": "full"}, fetch)
        assert error == "v0002 is a full version; a canary evaluates LoRA adapters" and scores == {}
    finally:
        dead.close()
