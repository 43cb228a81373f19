"""The math agent: a chat loop with a calculator tool, instrumented only through OpenTelemetry.

It knows nothing about training. It calls an OpenAI-compatible endpoint (the agentlake gateway),
wraps each task in a rollout span carrying ``agentlake.rollout.id`` / ``agentlake.task.id``,
propagates the trace to the gateway with ``traceparent`` so the gateway's LLM spans join it, and
records the outcome as an ``agentlake.reward`` span (all three through ``examples.common``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry import trace

from examples.common import ChatRolloutResult, chat_turn, rollout_span, run_rollouts, turn_seed
from examples.math_agent.calculator import is_correct, parse_reply, respond
from examples.math_agent.tasks import MathTask, initial_messages

AGENT_NAME = "math-agent"
# Stop before the model writes the calculator's line itself.
STOP = ["\nRESULT", "RESULT:"]


@dataclass(kw_only=True)
class RolloutResult(ChatRolloutResult):
    answer: str | None = None


def run_rollout(
    client: httpx.Client,
    task: MathTask,
    *,
    model: str,
    max_turns: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 40,
    tracer: trace.Tracer | None = None,
    reward_span: bool = True,
    seed: int | None = None,
) -> RolloutResult:
    """Solve one task; the reward is 1 for the exact final answer, else 0.

    ``reward_span=False``: the trace carries no reward (production traffic posts it later). ``seed``: the
    rollout's sampling seed (turn ``k`` samples with ``seed + k``), for paired evaluations.
    """
    result = RolloutResult(task_id=task.task_id, transcript=initial_messages(task))
    with rollout_span(tracer or trace.get_tracer("examples.math_agent"), result, AGENT_NAME, reward_span=reward_span):
        for turn in range(max_turns):
            text = chat_turn(
                client,
                result,
                model=model,
                temperature=temperature,
                max_tokens=max_tokens,
                stop=STOP,
                seed=turn_seed(seed, turn),
            )
            reply = parse_reply(text)
            if reply.answer is not None:
                result.answer = reply.answer
                break
            result.transcript.append({"role": "user", "content": respond(reply)})
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
    return result


def run_batch(
    base_url: str, tasks: list[MathTask], *, model: str, concurrency: int = 4, **kwargs: Any
) -> list[RolloutResult]:
    """Run ``tasks`` concurrently against ``base_url`` (the gateway)."""
    return run_rollouts(run_rollout, base_url, tasks, model=model, concurrency=concurrency, **kwargs)
