"""What the three tool agents share around their framework: tracing into agentlake, and an HTTP client
whose requests name the rollout (so a gateway's span joins the agent's trace)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

import agentlake
from examples import common
from examples.math_agent.tasks import MathTask, make_tasks


@dataclass(kw_only=True)
class ToolRolloutResult(common.RolloutResult):
    """One rollout of a tool agent: its final answer and how many tool calls it made."""

    answer: str | None = None
    tool_calls: int = 0
    error: str | None = None  # the framework's exception, when the run ended in one


def traced_provider(agent_name: str, endpoint: str | None, exporter: SpanExporter | None) -> TracerProvider:
    """An agentlake tracer provider (to the collector, or to ``exporter``) for the framework's instrumentor."""
    return agentlake.init(
        endpoint,
        agent_name=agent_name,
        exporter=exporter,
        batch=exporter is None,
        instrument_openai=False,
        set_global=False,
    )


def rollout_http_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """An async HTTP client that adds ``agentlake.headers()`` (rollout, task, agent, ``traceparent``) to every
    request; ``transport`` replaces the network (tests: a scripted model)."""

    async def name_the_call(request: httpx.Request) -> None:
        for key, value in agentlake.headers().items():
            request.headers.setdefault(key, value)

    return httpx.AsyncClient(timeout=120, event_hooks={"request": [name_the_call]}, transport=transport)


async def gather_limited(
    tasks: Sequence[MathTask], one: Callable[[MathTask], Awaitable[ToolRolloutResult]], concurrency: int
) -> list[ToolRolloutResult]:
    """``one`` over ``tasks`` with at most ``concurrency`` in flight, results in task order."""
    gate = asyncio.Semaphore(concurrency)

    async def limited(task: MathTask) -> ToolRolloutResult:
        async with gate:
            return await one(task)

    return list(await asyncio.gather(*(limited(t) for t in tasks)))


def heldout_tasks(n: int = 32) -> list[MathTask]:
    """Held-out multiplication tasks of their own seed (one tool call solves each)."""
    return make_tasks(n, seed=3000, prefix="tools-heldout", kinds=("multiply",))
