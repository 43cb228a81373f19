"""The math task with PydanticAI: ``calculate`` is a plain function tool, the model an OpenAI-compatible chat
model, the trace PydanticAI's own instrumentation (OTel GenAI conventions: ``gen_ai.input.messages`` with
``tool_call`` and ``tool_call_response`` parts, ``gen_ai.tool.definitions``)."""

from __future__ import annotations

import json

import httpx
from openai import AsyncOpenAI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from pydantic_ai import Agent
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.exceptions import AgentRunError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

import agentlake
from examples.math_agent.calculator import is_correct
from examples.math_agent.tasks import MathTask
from examples.tool_agents import calculator_tool as calc
from examples.tool_agents.plumbing import ToolRolloutResult, gather_limited, rollout_http_client, traced_provider

AGENT_NAME = "pydantic-ai-tools"
_provider: TracerProvider | None = None


def setup(endpoint: str | None = None, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """Trace to the collector (or ``exporter``); the agents made after this carry PydanticAI's instrumentation."""
    global _provider
    _provider = traced_provider(AGENT_NAME, endpoint, exporter)
    return _provider


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 34 and return the result.

    Args:
        expression: The expression to evaluate.
    """
    return calc.calculate(expression)


def worked_example() -> list[ModelMessage]:
    """The worked example as PydanticAI's message history."""
    call = ToolCallPart(calc.TOOL_NAME, json.loads(calc.EXAMPLE_ARGUMENTS), tool_call_id=calc.EXAMPLE_CALL_ID)
    return [
        ModelRequest(parts=[UserPromptPart(calc.EXAMPLE_QUESTION)]),
        ModelResponse(parts=[call]),
        ModelRequest(parts=[ToolReturnPart(calc.TOOL_NAME, calc.EXAMPLE_RESULT, tool_call_id=calc.EXAMPLE_CALL_ID)]),
        ModelResponse(parts=[TextPart(calc.EXAMPLE_ANSWER)]),
    ]


def make_agent(client: AsyncOpenAI, model: str, *, temperature: float, max_tokens: int) -> Agent[None, str]:
    if _provider is None:
        raise RuntimeError("call setup() first: the agent's instrumentation needs its tracer provider")
    return Agent(
        OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)),
        name=AGENT_NAME,
        system_prompt=calc.AGENT_SYSTEM_PROMPT,
        tools=[calculate],
        model_settings={"temperature": temperature, "max_tokens": max_tokens},
        capabilities=[Instrumentation(InstrumentationSettings(tracer_provider=_provider))],
    )


async def run_rollout(agent: Agent[None, str], task: MathTask, *, max_turns: int = 4) -> ToolRolloutResult:
    """One task inside ``agentlake.rollout``; reward 1 for the exact final answer (0 when the run fails)."""
    with agentlake.rollout(task_id=task.task_id, agent_name=AGENT_NAME) as r:
        assert r.rollout_id is not None
        result = ToolRolloutResult(task_id=task.task_id, rollout_id=r.rollout_id)
        history = worked_example()
        try:
            run = await agent.run(
                task.question, message_history=history, usage_limits=UsageLimits(request_limit=max_turns)
            )
            new = run.all_messages()[len(history) :]
            responses = [m for m in new if isinstance(m, ModelResponse)]
            result.calls = len(responses)
            result.tool_calls = sum(1 for m in responses for p in m.parts if isinstance(p, ToolCallPart))
            result.answer = calc.final_answer(run.output)
            result.transcript = [m.parts for m in new]
        except AgentRunError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
        r.emit_reward(result.reward)
    return result


async def run_batch_async(
    base_url: str,
    tasks: list[MathTask],
    *,
    model: str,
    concurrency: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 48,
    max_turns: int = 4,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[ToolRolloutResult]:
    """Run ``tasks`` against ``base_url`` (the gateway or vLLM); call ``setup`` first."""
    client = AsyncOpenAI(
        base_url=f"{base_url.rstrip('/')}/v1",
        api_key="agentlake",
        http_client=rollout_http_client(transport),
        max_retries=0,
    )
    agent = make_agent(client, model, temperature=temperature, max_tokens=max_tokens)
    try:
        return await gather_limited(tasks, lambda t: run_rollout(agent, t, max_turns=max_turns), concurrency)
    finally:
        await client.close()
