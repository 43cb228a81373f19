"""The rollout plumbing the example agents share, so each agent file holds only its task logic.

An agent's trace must carry the rollout, task and agent ids and end with a reward (see
``examples/README.md``); the math and SQL agents emit those spans themselves and talk raw HTTP
to the gateway, so the span shapes and the headers live here, once.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from opentelemetry import propagate, trace

from schemas import attributes as attr

ROLLOUT_HEADER = "x-agentlake-rollout-id"
# One request's limit: CPU vLLM answering 16 requests at once on a shared 2-core machine took over 120 s for
# one of them (a demo run next to three test servers, load ~24); a slow answer is not a failed rollout.
REQUEST_TIMEOUT_S = 600.0
T = TypeVar("T")
R = TypeVar("R")


@dataclass(kw_only=True)
class RolloutResult:
    """What every example agent reports about one rollout; each agent subclasses it with its own outcome."""

    task_id: str
    rollout_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    reward: float = 0.0
    calls: int = 0
    transcript: list[Any] = field(default_factory=list)


@dataclass(kw_only=True)
class ChatRolloutResult(RolloutResult):
    """A rollout driven by ``chat_turn``: ``transcript`` is the chat so far, ``models`` served each call."""

    models: list[str] = field(default_factory=list)
    transcript: list[dict[str, str]] = field(default_factory=list)


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of a rollout's ``turn``-th model call: ``seed + turn`` (None: unseeded), so a
    multi-turn rollout draws the same samples each time it is replayed for a paired evaluation."""
    return None if seed is None else seed + turn


def chat_turn(
    client: httpx.Client,
    result: ChatRolloutResult,
    *,
    model: str,
    temperature: float,
    max_tokens: int,
    stop: list[str],
    seed: int | None = None,
) -> str:
    """Send ``result.transcript`` to the gateway and append the assistant's reply; returns its text.

    The rollout header and ``traceparent`` let the gateway file its LLM span under this rollout's
    trace; ``result`` counts the call and the model that served it. ``seed``: vLLM's per-request
    sampling seed (a paired evaluation draws the same samples for both versions it compares).
    """
    headers = {ROLLOUT_HEADER: result.rollout_id}
    propagate.inject(headers)
    body_in: dict[str, Any] = {
        "model": model,
        "messages": result.transcript,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stop": stop,
    }
    if seed is not None:
        body_in["seed"] = seed
    response = client.post("/v1/chat/completions", headers=headers, json=body_in)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    text = body["choices"][0]["message"]["content"] or ""
    result.calls += 1
    result.models.append(body.get("model", model))
    result.transcript.append({"role": "assistant", "content": text})
    return text


@contextmanager
def rollout_span(
    tracer: trace.Tracer, result: RolloutResult, agent_name: str, *, reward_span: bool = True
) -> Iterator[None]:
    """The ``agentlake.rollout`` root span around one rollout, ended by a reward span of ``result.reward``.

    The reward is read when the block ends, so set it inside. If the block raises, the root span
    records the error and ends with neither a reward nor a ``finished`` status. ``reward_span=False``:
    the trace ends without one, as in production, where the reward is posted later (or never) to
    the collector's ``/v1/rewards`` by whoever learns it.
    """
    ids = {attr.ROLLOUT_ID: result.rollout_id, attr.TASK_ID: result.task_id, attr.AGENT_NAME: agent_name}
    with tracer.start_as_current_span(attr.ROLLOUT_SPAN_NAME, attributes=ids) as root:
        yield
        if not reward_span:
            root.set_attribute(attr.ROLLOUT_STATUS, "finished")
            return
        reward = {attr.REWARD_VALUE: result.reward, attr.REWARD_NAME: attr.PRIMARY_REWARD_NAME}
        with tracer.start_as_current_span(attr.REWARD_SPAN_NAME, attributes={**ids, **reward}):
            pass
        root.set_attribute(attr.ROLLOUT_STATUS, "finished")


def run_rollouts(
    run_rollout: Callable[..., R],
    base_url: str,
    tasks: Sequence[T],
    *,
    model: str,
    concurrency: int,
    on_done: Callable[[int, int], None] | None = None,
    seeds: Sequence[int] | None = None,
    **kwargs: Any,
) -> list[R]:
    """``run_rollout(client, task, model=model, **kwargs)`` for each task, ``concurrency`` at a time, in order.

    ``on_done(done, total)`` is called as each rollout finishes, for a progress display. ``seeds``: one
    sampling seed per task, passed as ``seed=`` (the agent's ``run_rollout`` must take it).
    """
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
    lock = threading.Lock()
    done = 0

    def one(item: tuple[int, T]) -> R:
        nonlocal done
        i, task = item
        extra = {} if seeds is None else {"seed": seeds[i]}
        result = run_rollout(client, task, model=model, **kwargs, **extra)
        if on_done is not None:
            with lock:
                done += 1
                on_done(done, len(tasks))
        return result

    with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, enumerate(tasks)))
