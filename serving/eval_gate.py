"""The optional evaluation gate of a publish: held-out tasks, and how a served model scores on them.

A candidate adapter is loaded under a temporary name (``candidate_name``) and scored next to what is
served, task by task (``compare``); a candidate worse beyond noise (``worse``: the paired bootstrap
interval of serving.evaluation lies below zero at ``serving.eval_gate_confidence``) is ``rejected`` and
serving is left alone. A lower mean within noise publishes: a bare "lower" rejected good versions on
the luck of a few tasks. The publisher runs the comparison on its own vLLM; with replicas, the canary
replica's loader runs the same comparison on its vLLM (serving.canary), so both paths score the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.errors import PublishError
from serving.evaluation import DEFAULT_CONFIDENCE, LOSS, Paired
from serving.evaluation import compare as compare_paired
from serving.vllm_client import VllmClient

log = logging.getLogger(__name__)


@dataclass
class EvalTask:
    prompt: str
    answer: str  # the completion must contain it


def load_eval_tasks(path: str | Path | None) -> list[EvalTask]:
    """Held-out tasks, one JSON object per line: {"prompt": ..., "answer": ...}; none for no path.

    A missing file, a line that is not JSON or lacks a field is a ``PublishError`` naming the line,
    raised before any model is loaded or scored."""
    if path is None:
        return []
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PublishError(f"evaluation tasks {path} cannot be read ({exc.strerror or exc})") from exc
    tasks = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise PublishError(f"{path}:{i}: not a JSON object ({exc})") from exc
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("prompt"), str)
                or not isinstance(obj.get("answer"), str)
            ):
                raise PublishError(f"{path}:{i}: each line needs string fields 'prompt' and 'answer'")
            tasks.append(EvalTask(obj["prompt"], obj["answer"]))
    if not tasks:
        raise PublishError(f"evaluation tasks {path} holds no task: a gate on nothing would pass every version")
    return tasks


@dataclass(frozen=True)
class GateScores:
    """Both models' per-task scores (1.0 answered, 0.0 not), in task order: what the gate decides on."""

    candidate: list[float]
    serving: list[float]

    def means(self) -> dict[str, float]:
        """The fractions answered (the keys the registry records as ``eval_candidate``, ``eval_serving``)."""
        return {"candidate": _mean(self.candidate), "serving": _mean(self.serving)}

    def paired(self, confidence: float = DEFAULT_CONFIDENCE) -> Paired:
        """Candidate against serving on the same tasks (serving.evaluation; ``after`` is the candidate)."""
        return compare_paired(
            {str(i): v for i, v in enumerate(self.serving)},
            {str(i): v for i, v in enumerate(self.candidate)},
            confidence=confidence,
        )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def task_scores(client: VllmClient, model: str, tasks: Sequence[EvalTask], *, max_tokens: int = 64) -> list[float]:
    """Per task: 1.0 when the greedy completion contains the answer, else 0.0."""
    return [float(t.answer in client.complete(model, t.prompt, max_tokens=max_tokens)) for t in tasks]


def score(client: VllmClient, model: str, tasks: Sequence[EvalTask], *, max_tokens: int = 64) -> float:
    """Fraction of tasks whose greedy completion contains the answer."""
    return _mean(task_scores(client, model, tasks, max_tokens=max_tokens))


def candidate_name(served_name: str, version: str) -> str:
    """The temporary name a candidate is scored under: beside the served name, never in its place."""
    return f"{served_name}-candidate-{version}"


def worse(scores: GateScores, confidence: float = DEFAULT_CONFIDENCE) -> bool:
    """Whether the candidate is worse than what serves beyond noise: the whole ``confidence`` interval of the
    paired difference lies below zero (``confidence`` 0: any lower mean; a tie always publishes)."""
    return scores.paired(confidence).verdict == LOSS


def base_name(client: VllmClient) -> str:
    """The name vLLM serves its base model under: the baseline when no adapter serves yet."""
    base = client.base_model()
    if base is None:
        raise PublishError("vLLM lists no base model to evaluate against")
    return base[0]


def compare(
    client: VllmClient, *, candidate: str, folder: str, baseline: str | None, tasks: Sequence[EvalTask]
) -> GateScores:
    """Load ``folder`` as ``candidate``, score it and ``baseline`` (None: the base model) on each of ``tasks``.

    The candidate is unloaded again whatever happens, so the served names are what they were before."""
    baseline = baseline or base_name(client)
    client.load_lora(candidate, folder, inplace=True)
    try:
        return GateScores(task_scores(client, candidate, tasks), task_scores(client, baseline, tasks))
    finally:
        try:
            client.unload_lora(candidate)
        except PublishError as exc:
            log.warning("could not unload evaluation adapter %s: %s", candidate, exc)
