"""The math task, solved by an OpenAI Agents SDK agent traced by OpenInference's standard instrumentation.

This is what an existing framework agent looks like when it joins agentlake: no agentlake code in
its loop, only tracing set up around it. ``openinference-instrumentation-openai-agents`` turns the
SDK's own traces into OTel spans (an ``AGENT`` span per run, an ``LLM`` span per model call with
``llm.input_messages.*`` / ``llm.output_messages.*``); ``agentlake.rollout`` stamps every one of
them with the rollout, task and agent ids; ``agentlake.emit_reward`` adds the reward span. The
model is a plain chat model (``OpenAIChatCompletionsModel``) with no tools declared, so vLLM needs
no ``--enable-auto-tool-choice``: the calculator protocol (``CALC:`` / ``RESULT:``) runs between
turns, and each turn continues the conversation with ``result.to_input_list()``.

Point ``base_url`` at the agentlake gateway to get exact token ids too: every request carries
``agentlake.headers()`` (the rollout, task and agent in ``x-agentlake-*`` headers, and ``traceparent``),
so the gateway's span joins the same trace and the call is served by the agent's policy line, if it
has one (``trainer.agents``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner
from agents import trace as agents_trace
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

import agentlake
from examples import common
from examples.math_agent.calculator import is_correct, parse_reply, respond
from examples.math_agent.tasks import SYSTEM_PROMPT, WORKED_EXAMPLE, MathTask, make_tasks

AGENT_NAME = "framework-agent"


@dataclass(kw_only=True)
class RolloutResult(common.RolloutResult):
    answer: str | None = None


def setup(endpoint: str | None = None, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """Trace to the agentlake collector (or ``exporter``) and switch on the OpenInference instrumentation.

    The instrumentor replaces the Agents SDK's default trace processor (which uploads to OpenAI)
    with one that writes OTel spans into our provider. Calling ``setup`` again re-targets it.
    """
    provider = agentlake.init(
        endpoint,
        agent_name=AGENT_NAME,
        exporter=exporter,
        batch=exporter is None,
        instrument_openai=False,
        set_global=False,
    )
    instrumentor = OpenAIAgentsInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=provider)
    return provider


def make_client(
    base_url: str, *, api_key: str = "agentlake", transport: httpx.AsyncBaseTransport | None = None
) -> AsyncOpenAI:
    """An OpenAI client whose every request carries ``agentlake.headers()``: the current rollout and agent,
    and ``traceparent``, so a gateway's span joins the trace (a header the request already has is kept).

    ``transport`` replaces the network (tests: ``httpx.MockTransport``).
    """

    async def name_the_call(request: httpx.Request) -> None:
        for key, value in agentlake.headers().items():
            request.headers.setdefault(key, value)

    http = httpx.AsyncClient(timeout=120, event_hooks={"request": [name_the_call]}, transport=transport)
    return AsyncOpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key=api_key, http_client=http)


def make_agent(client: AsyncOpenAI, model: str, *, temperature: float, max_tokens: int) -> Agent:
    """A plain chat agent: instructions, the worked example as history, no tools."""
    return Agent(
        name=AGENT_NAME,
        instructions=SYSTEM_PROMPT,
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(
            temperature=temperature, max_tokens=max_tokens, extra_args={"stop": ["\nRESULT", "RESULT:"]}
        ),
    )


async def solve_turns(turn_agent: Agent, history: list[Any], result: RolloutResult, *, max_turns: int) -> list[Any]:
    """Turns of calculator use until a final answer (in ``result``) or ``max_turns``; the history after them."""
    for _ in range(max_turns):
        run = await Runner.run(turn_agent, history, max_turns=1)
        result.calls += 1
        history = run.to_input_list()
        reply = parse_reply(str(run.final_output or ""))
        if reply.answer is not None:
            result.answer = reply.answer
            break
        history.append({"role": "user", "content": respond(reply)})
    return history


async def run_rollout(agent: Agent, task: MathTask, *, max_turns: int = 4) -> RolloutResult:
    """One task inside ``agentlake.rollout``; the reward is 1 for the exact final answer, else 0."""
    with agentlake.rollout(task_id=task.task_id, agent_name=AGENT_NAME) as r:
        assert r.rollout_id is not None
        result = RolloutResult(task_id=task.task_id, rollout_id=r.rollout_id)
        history: list[Any] = [*WORKED_EXAMPLE, {"role": "user", "content": task.question}]
        with agents_trace("math rollout", group_id=r.rollout_id):
            history = await solve_turns(agent, history, result, max_turns=max_turns)
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
        r.emit_reward(result.reward)
        result.transcript = history
    return result


async def run_batch_async(
    base_url: str,
    tasks: list[MathTask],
    *,
    model: str,
    concurrency: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 40,
    max_turns: int = 4,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RolloutResult]:
    """Run ``tasks`` with at most ``concurrency`` in flight; call ``setup`` first."""
    client = make_client(base_url, transport=transport)
    agent = make_agent(client, model, temperature=temperature, max_tokens=max_tokens)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: MathTask) -> RolloutResult:
        async with gate:
            return await run_rollout(agent, task, max_turns=max_turns)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await client.close()


def run_batch(base_url: str, tasks: list[MathTask], *, model: str, **kwargs: Any) -> list[RolloutResult]:
    """Synchronous ``run_batch_async``."""
    return asyncio.run(run_batch_async(base_url, tasks, model=model, **kwargs))


def heldout_tasks(n: int = 32) -> list[MathTask]:
    """Held-out math tasks of their own seed and prefix, never used for this agent's training rounds."""
    return make_tasks(n, seed=2000, prefix="framework-heldout")
