"""`run_rollouts` keeps the task order and reports each finished rollout once (the demo's progress line)."""

import random
import time

import httpx

from examples.common import run_rollouts


def test_progress_counts_every_rollout_once_and_results_keep_task_order() -> None:
    def slow_echo(client: httpx.Client, task: int, *, model: str) -> tuple[int, str]:
        time.sleep(random.uniform(0, 0.02))  # finish out of order
        return task, model

    seen: list[tuple[int, int]] = []
    results = run_rollouts(
        slow_echo, "http://unused", list(range(40)), model="m", concurrency=8, on_done=lambda d, t: seen.append((d, t))
    )
    assert results == [(i, "m") for i in range(40)]
    assert seen == [(d, 40) for d in range(1, 41)]
