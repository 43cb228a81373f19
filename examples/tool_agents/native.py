"""The math agent with a native function tool over raw HTTP: what `agentlake demo --agent tools` trains.

Each request declares ``calculate`` in ``tools``; a reply with ``tool_calls`` is answered with one
``role: "tool"`` message per call, and the loop goes on until the model writes ``ANSWER: <n>`` or runs out
of turns. The first turn names the tool in ``tool_choice`` (the OpenAI API's way to require a call), later
turns leave it ``"auto"``: the shipped SmolLM2-135M never chooses a tool by itself (0 of 96 held-out turns
with ``"auto"``), so without it no rollout calls the tool and there is nothing to learn. vLLM's hermes
parser then constrains only the frame (``<tool_call>{"name": "calculate", "arguments": ...}</tool_call>``,
a structural tag); the arguments, and the answer after the tool's result, are the model's own, and the
text is the parser's format the template renders (the gateway records the engine's ids). What the policy
learns is to write a good expression and to answer from the result. A call to an unknown function, or
arguments that are not JSON, are answered with an error as the tool's result: the model's turn stays in its
training data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry import propagate, trace

from examples.common import ROLLOUT_HEADER, ChatRolloutResult, rollout_span, run_rollouts, turn_seed
from examples.math_agent.calculator import is_correct
from examples.math_agent.tasks import MathTask
from examples.tool_agents import calculator_tool as calc

AGENT_NAME = "tools-agent"
REQUIRE_CALCULATE = {"type": "function", "function": {"name": calc.TOOL_NAME}}


def tool_choice(turn: int, *, require_first_call: bool = True) -> str | dict[str, Any]:
    """``tool_choice`` for turn ``turn`` (0-based): the calculator named on the first turn, else ``"auto"``."""
    return REQUIRE_CALCULATE if require_first_call and turn == 0 else "auto"


@dataclass(kw_only=True)
class RolloutResult(ChatRolloutResult):
    answer: str | None = None
    tool_calls: int = 0
    transcript: list[dict[str, Any]]  # tool turns carry more than role and content


def initial_messages(task: MathTask) -> list[dict[str, Any]]:
    """Instructions, the worked example (a tool call and its result), the question."""
    return [
        {"role": "system", "content": calc.AGENT_SYSTEM_PROMPT},
        *calc.WORKED_EXAMPLE,
        {"role": "user", "content": task.question},
    ]


def run_tool(call: dict[str, Any]) -> str:
    """The result the model gets for one of its calls; a malformed call gets an error it can read."""
    function = call.get("function") or {}
    if function.get("name") != calc.TOOL_NAME:
        return f"error: unknown tool {function.get('name')!r}; the tool is {calc.TOOL_NAME}"
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        return 'error: arguments must be JSON, like {"expression": "12 * 34"}'
    expression = arguments.get("expression") if isinstance(arguments, dict) else None
    if not isinstance(expression, str):
        return 'error: give the expression as {"expression": "12 * 34"}'
    return calc.calculate(expression)


def tool_turn(
    client: httpx.Client,
    result: RolloutResult,
    *,
    model: str,
    temperature: float,
    max_tokens: int,
    seed: int | None = None,
    choice: str | dict[str, Any] = "auto",
) -> dict[str, Any]:
    """One request with the tool declared; the reply is appended to the transcript and returned."""
    headers = {ROLLOUT_HEADER: result.rollout_id}
    propagate.inject(headers)
    body = {
        "model": model,
        "messages": result.transcript,
        "tools": [calc.CALCULATE_TOOL],
        "tool_choice": choice,
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    if seed is not None:
        body["seed"] = seed  # vLLM's per-request sampling seed (paired evaluations)
    response = client.post("/v1/chat/completions", headers=headers, json=body)
    response.raise_for_status()
    reply: dict[str, Any] = response.json()
    message = reply["choices"][0]["message"]
    result.calls += 1
    result.models.append(reply.get("model", model))
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        turn["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": c.get("function") or {}} for c in message["tool_calls"]
        ]
    result.transcript.append(turn)
    return turn


def run_rollout(
    client: httpx.Client,
    task: MathTask,
    *,
    model: str,
    max_turns: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 48,
    tracer: trace.Tracer | None = None,
    reward_span: bool = True,
    seed: int | None = None,
    require_first_call: bool = True,
) -> RolloutResult:
    """Solve one task; the reward is 1 for the exact final answer, else 0 (``seed``: turn ``k`` samples with
    ``seed + k``; ``require_first_call``: see ``tool_choice``)."""
    result = RolloutResult(task_id=task.task_id, transcript=initial_messages(task))
    with rollout_span(tracer or trace.get_tracer("examples.tool_agents"), result, AGENT_NAME, reward_span=reward_span):
        for k in range(max_turns):
            turn = tool_turn(
                client,
                result,
                model=model,
                temperature=temperature,
                max_tokens=max_tokens,
                seed=turn_seed(seed, k),
                choice=tool_choice(k, require_first_call=require_first_call),
            )
            calls = turn.get("tool_calls") or []
            if not calls:
                result.answer = calc.final_answer(turn.get("content"))
                break
            result.tool_calls += len(calls)
            for call in calls:
                result.transcript.append({"role": "tool", "tool_call_id": call.get("id"), "content": run_tool(call)})
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
    return result


def run_batch(
    base_url: str, tasks: list[MathTask], *, model: str, concurrency: int = 4, **kwargs: Any
) -> list[RolloutResult]:
    """Run ``tasks`` concurrently against ``base_url`` (the gateway)."""
    return run_rollouts(run_rollout, base_url, tasks, model=model, concurrency=concurrency, **kwargs)
