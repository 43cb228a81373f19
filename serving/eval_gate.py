"""The optional evaluation gate of a publish: held-out tasks, and how a served model scores on them.

A candidate adapter is loaded under a temporary name (``candidate_name``) and scored next to what is
served (``compare``); a candidate that scores lower (``worse``) is ``rejected`` and serving is left
alone. The publisher runs the comparison on its own vLLM; with replicas, the canary replica's loader
runs the same comparison on its vLLM (serving.canary), so both paths score the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.errors import PublishError
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


def score(client: VllmClient, model: str, tasks: Sequence[EvalTask], *, max_tokens: int = 64) -> float:
    """Fraction of tasks whose greedy completion contains the answer."""
    if not tasks:
        return 0.0
    hits = sum(t.answer in client.complete(model, t.prompt, max_tokens=max_tokens) for t in tasks)
    return hits / len(tasks)


def candidate_name(served_name: str, version: str) -> str:
    """The temporary name a candidate is scored under: beside the served name, never in its place."""
    return f"{served_name}-candidate-{version}"


def worse(scores: dict[str, float]) -> bool:
    """Whether the candidate scored below what serves (a tie publishes)."""
    return scores["candidate"] < scores["serving"]


def base_name(client: VllmClient) -> str:
    """The name vLLM serves its base model under: the baseline when no adapter serves yet."""
    base = client.base_model()
    if base is None:
        raise PublishError("vLLM lists no base model to evaluate against")
    return base[0]


def compare(
    client: VllmClient, *, candidate: str, folder: str, baseline: str | None, tasks: Sequence[EvalTask]
) -> dict[str, float]:
    """Load ``folder`` as ``candidate``, score it and ``baseline`` (None: the base model) on ``tasks``.

    The candidate is unloaded again whatever happens, so the served names are what they were before."""
    baseline = baseline or base_name(client)
    client.load_lora(candidate, folder, inplace=True)
    try:
        return {"candidate": score(client, candidate, tasks), "serving": score(client, baseline, tasks)}
    finally:
        try:
            client.unload_lora(candidate)
        except PublishError as exc:
            log.warning("could not unload evaluation adapter %s: %s", candidate, exc)
