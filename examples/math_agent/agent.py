"""The math agent: a chat loop with a calculator tool, instrumented only through OpenTelemetry.

It knows nothing about training. It calls an OpenAI-compatible endpoint (the agentlake gateway),
wraps each task in a rollout span carrying ``agentlake.rollout.id`` / ``agentlake.task.id``,
propagates the trace to the gateway with ``traceparent`` so the gateway's LLM spans join it, and
records the outcome as an ``agentlake.reward`` span.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from opentelemetry import propagate, trace

from examples.math_agent.calculator import CalcError, evaluate, format_number, is_correct, parse_reply
from examples.math_agent.tasks import MathTask, initial_messages
from schemas import attributes as attr

AGENT_NAME = "math-agent"


@dataclass
class RolloutResult:
    task_id: str
    rollout_id: str
    reward: float
    answer: str | None
    calls: int
    models: list[str] = field(default_factory=list)
    transcript: list[dict[str, str]] = field(default_factory=list)


def run_rollout(
    client: httpx.Client,
    task: MathTask,
    *,
    model: str,
    max_turns: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 40,
    tracer: trace.Tracer | None = None,
) -> RolloutResult:
    """Solve one task; the reward is 1 for the exact final answer, else 0."""
    tracer = tracer or trace.get_tracer("examples.math_agent")
    rollout_id = uuid.uuid4().hex
    messages = initial_messages(task)
    result = RolloutResult(task_id=task.task_id, rollout_id=rollout_id, reward=0.0, answer=None, calls=0)
    ids = {attr.ROLLOUT_ID: rollout_id, attr.TASK_ID: task.task_id, attr.AGENT_NAME: AGENT_NAME}
    with tracer.start_as_current_span(attr.ROLLOUT_SPAN_NAME, attributes=ids) as root:
        for _ in range(max_turns):
            headers = {"x-agentlake-rollout-id": rollout_id}
            propagate.inject(headers)
            response = client.post(
                "/v1/chat/completions",
                headers=headers,
                json={
                    "model": model,
                    "messages": messages,
                    "temperature": temperature,
                    "max_tokens": max_tokens,
                    "stop": ["\nRESULT", "RESULT:"],
                },
            )
            response.raise_for_status()
            body = response.json()
            result.calls += 1
            result.models.append(body.get("model", model))
            text = body["choices"][0]["message"]["content"] or ""
            messages.append({"role": "assistant", "content": text})
            reply = parse_reply(text)
            if reply.answer is not None:
                result.answer = reply.answer
                break
            if reply.calc is None:
                messages.append({"role": "user", "content": "Use CALC: <expression> or give ANSWER: <number>."})
                continue
            try:
                observation = f"RESULT: {format_number(evaluate(reply.calc))}"
            except CalcError as exc:
                observation = f"RESULT: error ({exc})"
            messages.append({"role": "user", "content": observation})
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
        with tracer.start_as_current_span(
            attr.REWARD_SPAN_NAME,
            attributes={**ids, attr.REWARD_VALUE: result.reward, attr.REWARD_NAME: attr.PRIMARY_REWARD_NAME},
        ):
            pass
        root.set_attribute(attr.ROLLOUT_STATUS, "finished")
    result.transcript = messages
    return result


def run_batch(
    base_url: str, tasks: list[MathTask], *, model: str, concurrency: int = 4, **kwargs: object
) -> list[RolloutResult]:
    """Run ``tasks`` concurrently against ``base_url`` (the gateway)."""
    with httpx.Client(base_url=base_url, timeout=120) as client, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda t: run_rollout(client, t, model=model, **kwargs), tasks))  # type: ignore[arg-type]
