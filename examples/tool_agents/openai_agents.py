"""The math task with the OpenAI Agents SDK: ``calculate`` is a ``@function_tool``, the model a chat-completions
model (or, with ``responses=True``, the Responses API model: ``POST /v1/responses``, which vLLM and the
gateway serve too), the trace OpenInference's ``openai-agents`` instrumentation. The SDK runs the tool loop itself."""

from __future__ import annotations

from typing import Any

import httpx
from agents import Agent, Model, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
from agents.exceptions import AgentsException
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

import agentlake
from examples.math_agent.calculator import is_correct
from examples.math_agent.tasks import MathTask
from examples.tool_agents import calculator_tool as calc
from examples.tool_agents.plumbing import ToolRolloutResult, gather_limited, rollout_http_client, traced_provider

AGENT_NAME = "openai-agents-tools"


@function_tool(name_override=calc.TOOL_NAME)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 34 and return the result.

    Args:
        expression: The expression to evaluate.
    """
    return calc.calculate(expression)


def setup(endpoint: str | None = None, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """Trace to the collector (or ``exporter``) through OpenInference's Agents SDK instrumentation."""
    provider = traced_provider(AGENT_NAME, endpoint, exporter)
    instrumentor = OpenAIAgentsInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=provider)
    return provider


def worked_example() -> list[Any]:
    """The worked example as the Agents SDK's input items (Responses-style function call and output)."""
    return [
        {"role": "user", "content": calc.EXAMPLE_QUESTION},
        {
            "type": "function_call",
            "call_id": calc.EXAMPLE_CALL_ID,
            "name": calc.TOOL_NAME,
            "arguments": calc.EXAMPLE_ARGUMENTS,
        },
        {"type": "function_call_output", "call_id": calc.EXAMPLE_CALL_ID, "output": calc.EXAMPLE_RESULT},
        {"role": "assistant", "content": calc.EXAMPLE_ANSWER},
    ]


def make_agent(
    client: AsyncOpenAI, model: str, *, temperature: float, max_tokens: int, responses: bool = False
) -> Agent:
    """The agent on the chat-completions model, or on the Responses API model with ``responses``."""
    served: Model = (
        OpenAIResponsesModel(model=model, openai_client=client)
        if responses
        else OpenAIChatCompletionsModel(model=model, openai_client=client)
    )
    return Agent(
        name=AGENT_NAME,
        instructions=calc.AGENT_SYSTEM_PROMPT,
        tools=[calculate],
        model=served,
        model_settings=ModelSettings(temperature=temperature, max_tokens=max_tokens),
    )


async def run_rollout(agent: Agent, task: MathTask, *, max_turns: int = 4) -> ToolRolloutResult:
    """One task inside ``agentlake.rollout``; reward 1 for the exact final answer. A run the SDK ends with an
    error (too many turns, a call to an unknown tool) scores 0 and keeps its spans."""
    with agentlake.rollout(task_id=task.task_id, agent_name=AGENT_NAME) as r:
        assert r.rollout_id is not None
        result = ToolRolloutResult(task_id=task.task_id, rollout_id=r.rollout_id)
        try:
            run = await Runner.run(
                agent, [*worked_example(), {"role": "user", "content": task.question}], max_turns=max_turns
            )
            items = run.to_input_list()
            result.answer = calc.final_answer(str(run.final_output or ""))
            result.tool_calls = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call") - 1
            result.calls = len(run.raw_responses)
            result.transcript = items
        except AgentsException as exc:
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
    responses: bool = False,
) -> list[ToolRolloutResult]:
    """Run ``tasks`` against ``base_url`` (the gateway or vLLM); call ``setup`` first. ``responses``: through
    the Responses API (``/v1/responses``) rather than chat completions."""
    client = AsyncOpenAI(
        base_url=f"{base_url.rstrip('/')}/v1", api_key="agentlake", http_client=rollout_http_client(transport)
    )
    agent = make_agent(client, model, temperature=temperature, max_tokens=max_tokens, responses=responses)
    try:
        return await gather_limited(tasks, lambda t: run_rollout(agent, t, max_turns=max_turns), concurrency)
    finally:
        await client.close()
