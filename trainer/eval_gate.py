"""The optional evaluation gate of a publish: held-out tasks, and how a served model scores on them.

The publisher loads a candidate adapter under a temporary name and scores it next to the serving
version; a candidate that scores lower is ``rejected`` and serving is left alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import PublishError
from trainer.vllm_client import VllmClient


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
