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


def load_eval_tasks(path: str | Path) -> list[EvalTask]:
    """Held-out tasks, one JSON object per line: {"prompt": ..., "answer": ...}."""
    tasks = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            obj = json.loads(line)
            if not isinstance(obj.get("prompt"), str) or not isinstance(obj.get("answer"), str):
                raise PublishError(f"{path}:{i}: each line needs string fields 'prompt' and 'answer'")
            tasks.append(EvalTask(obj["prompt"], obj["answer"]))
    return tasks


def score(client: VllmClient, model: str, tasks: Sequence[EvalTask], *, max_tokens: int = 64) -> float:
    """Fraction of tasks whose greedy completion contains the answer."""
    if not tasks:
        return 0.0
    hits = sum(t.answer in client.complete(model, t.prompt, max_tokens=max_tokens) for t in tasks)
    return hits / len(tasks)
