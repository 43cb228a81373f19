"""The eval gate through the release bus: one replica, the canary, scores a candidate beside what it serves.

With ``serving.replicas`` the trainer host does not reach the replicas' vLLMs, so the gate
(serving.eval_gate) runs on one of them: the canary (``serving.canary``, default the first replica).

1. The publisher sends an ``evaluate`` command on the models topic (``evaluate_command``): the
   candidate's files and manifest hash as a release command has them, ``targets = [canary]``, and the
   held-out tasks inline (at most ``MAX_TASKS_BYTES`` of JSON: a Kafka record is no place for a data set).
2. The canary's loader (``serving.loader.Loader.handle`` calls ``evaluate``) fetches and verifies the
   candidate as it would a release, loads it under ``<served>-candidate-<version>``, scores it next to what
   it serves under the served name (the base model when it serves nothing), unloads the temporary name
   whatever happened, and acks with both scores, each task's scores and the number of tasks (``ok`` false and
   the error on any failure). The served name is never touched.
3. The publisher waits for that one ack (``ask_canary``): worse than serving beyond noise (the paired bootstrap
   of serving.evaluation, as the direct gate decides) is ``rejected``, a canary that failed or stayed silent
   is ``failed``; only a candidate that is not worse is released to every replica, as without the gate.

An evaluate command is not a release: ``serving.loader.targets_me`` takes ``release`` and ``unload`` only, so
a loader's startup catch-up and its resync never apply one again (a loader that was down when one came
leaves the publisher to time out, naming the canary).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.config import KafkaSettings
from schemas.errors import AgentlakeError
from schemas.tables import MODEL_RELEASE_EVENT
from schemas.validation import validate_record
from serving.errors import PublishError
from serving.eval_gate import EvalTask, GateScores, candidate_name, compare
from serving.release_bus import wait_for_acks
from serving.releases import release_command, send_release_event
from serving.vllm_client import VllmClient

EVALUATE = "evaluate"  # the status of an evaluate command on the models topic
MAX_TASKS_BYTES = 256 * 1024  # the tasks' JSON inside one command; Kafka's default record limit is 1 MiB


def evaluate_command(
    row: Mapping[str, Any], *, served_name: str, tasks: Sequence[EvalTask], canary: str
) -> dict[str, Any]:
    """An ``evaluate`` command for a registry row: a release command's fields, for ``canary`` only, with the tasks.

    A row the bus cannot carry or tasks too large for one record are a ``PublishError`` saying what to change."""
    if row["kind"] != "lora":
        raise PublishError(
            f"{row['version']} is a full-weight version; a canary evaluates LoRA adapters only "
            "(train with trainer.finetune = 'lora', or leave trainer.eval_tasks unset to release full weights)"
        )
    if not row.get("artifact_uri") or not row.get("manifest_sha256"):
        raise PublishError(f"{row['version']} has no stored artifact for the canary to fetch; train a new version")
    if not tasks:
        raise PublishError("an evaluate command needs at least one eval task (trainer.eval_tasks)")
    payload = [{"prompt": t.prompt, "answer": t.answer} for t in tasks]
    size = len(json.dumps(payload).encode())
    if size > MAX_TASKS_BYTES:
        raise PublishError(
            f"the {len(tasks)} eval tasks take {size} bytes of JSON, but an evaluate command carries them inline "
            f"and allows {MAX_TASKS_BYTES}: keep fewer or shorter tasks in trainer.eval_tasks"
        )
    command = release_command(dict(row), served_name=served_name, targets=[canary])
    command.update(status=EVALUATE, eval_tasks=payload)
    return validate_record(command, MODEL_RELEASE_EVENT)


def evaluates_here(event: Mapping[str, Any], replica: str) -> bool:
    """Whether a models-topic record is an evaluate command for this replica (it must be named: no broadcast)."""
    return event.get("status") == EVALUATE and replica in (event.get("targets") or [])


def evaluate(
    client: VllmClient, event: Mapping[str, Any], fetch: Callable[[Mapping[str, Any]], str]
) -> tuple[str | None, dict[str, Any]]:
    """Carry out one evaluate command on ``client``'s vLLM: the error (None when scored) and the ack's eval fields.

    ``fetch`` is the loader's own download and check (``Loader._fetch``), so the candidate is verified exactly as
    a release of it would be. Never raises: the loader turns the error into a failed ack."""
    name = str(event["served_name"])
    tasks = [EvalTask(t["prompt"], t["answer"]) for t in event.get("eval_tasks") or []]
    try:
        if not tasks:
            raise PublishError(f"the evaluate command for {event['version']} carries no eval task")
        if event.get("kind") != "lora":
            raise PublishError(f"{event['version']} is a {event.get('kind')} version; a canary evaluates LoRA adapters")
        folder = fetch(event)
        baseline = name if client.adapter_root(name) is not None else None  # None: the base model
        candidate = candidate_name(name, str(event["version"]))
        scores = compare(client, candidate=candidate, folder=folder, baseline=baseline, tasks=tasks)
    except Exception as exc:  # any failure becomes the ack's error: the loader keeps running
        return (str(exc) if isinstance(exc, AgentlakeError) else f"{type(exc).__name__}: {exc}"), {}
    means = scores.means()
    return None, {
        "eval_candidate": means["candidate"],
        "eval_serving": means["serving"],
        "eval_task_count": len(tasks),
        "eval_candidate_scores": scores.candidate,
        "eval_serving_scores": scores.serving,
    }


@dataclass(frozen=True)
class CanaryVerdict:
    """What the canary said about a candidate: both models' per-task scores, or why there are none."""

    canary: str
    scores: GateScores | None  # None on error
    tasks: int
    error: str  # "" when the canary scored the candidate
    seconds: float  # command sent -> ack (or the timeout)
    ack: dict[str, Any] | None = None


def ask_canary(
    kafka: KafkaSettings | None,
    row: Mapping[str, Any],
    *,
    served_name: str,
    tasks: Sequence[EvalTask],
    canary: str,
    timeout_s: float,
) -> CanaryVerdict:
    """Send an evaluate command for ``row`` to ``canary`` and wait for its scores. Never raises: a command that
    could not be built or sent, a failed or a silent canary all come back as the verdict's ``error``."""
    t0 = time.perf_counter()

    def verdict(error: str, ack: dict[str, Any] | None = None, scores: GateScores | None = None) -> CanaryVerdict:
        return CanaryVerdict(canary, scores, len(tasks), error, time.perf_counter() - t0, ack)

    try:
        if kafka is None:
            raise PublishError("serving.replicas is set but no Kafka is configured: the release bus runs on Kafka")
        command = evaluate_command(row, served_name=served_name, tasks=tasks, canary=canary)
        if err := send_release_event(kafka, command):
            raise PublishError(f"the evaluate command for {row['version']} was not sent: {err}")
        ack = wait_for_acks(kafka, command["release_id"], [canary], timeout_s=timeout_s).get(canary)
    except PublishError as exc:
        return verdict(f"canary {canary}: {exc}")
    if ack is None:
        return verdict(
            f"canary {canary} did not answer the evaluate command within {timeout_s:.0f}s "
            "(is its loader running? serving.canary names the replica that scores candidates)"
        )
    if not ack["ok"]:
        return verdict(f"canary {canary} could not evaluate {row['version']}: {ack['error']}", ack)
    candidate, serving = ack.get("eval_candidate_scores"), ack.get("eval_serving_scores")
    if candidate is None or serving is None or len(candidate) != len(tasks) or len(serving) != len(tasks):
        return verdict(
            f"canary {canary} acked without a score for each of the {len(tasks)} tasks; "
            "is its loader older than the evaluate command?",
            ack,
        )
    return verdict("", ack, GateScores([float(v) for v in candidate], [float(v) for v in serving]))
