"""The SDK names the rollout and the agent to the gateway (issue 13), so each agent's calls reach its own line.

The gateway is the real one (``GatewayServer`` on a socket, ``trainer.agents = ["planner", "solver"]``)
in front of the per-agent upstream of ``tests/collectors/test_gateway_per_agent.py``; the agent side is
the real OpenAI client, instrumented by ``agentlake.init``, and plain httpx with ``agentlake.headers()``.
What the gateway made of each call (the model it forwarded, the agent, rollout and parent it recorded)
shows which headers arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentlake
from agentlake._sdk import tracing
from collectors.gateway import proxy
from collectors.gateway.serve import GatewayServer
from collectors.sink import MemorySink
from schemas import attributes as A
from schemas.config import load_settings
from tests.collectors.helpers import LoopThread, wait_until
from tests.collectors.test_gateway import spans
from tests.collectors.test_gateway_per_agent import UPSTREAM, LinesVllm

MSGS = [{"role": "user", "content": "hello"}]


class Stack:
    """The gateway on a socket, what it recorded and what its upstream was asked."""

    def __init__(self, url: str, sink: MemorySink, upstream: LinesVllm) -> None:
        self.url, self.sink, self.upstream = url, sink, upstream

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="agentlake", max_retries=0, **kwargs)

    def last(self) -> tuple[str, dict[str, Any]]:
        """(the model the upstream was asked for, the recorded span) of the latest call, once recorded."""
        n = len(self.upstream.seen)
        wait_until(lambda: len(spans(self.sink)) >= n, 10, "the gateway's span")
        return self.upstream.seen[-1]["model"], spans(self.sink)[n - 1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = load_settings(
        environ={},
        discover=False,
        overrides={
            "state": {"dir": str(tmp_path_factory.mktemp("gateway-headers"))},
            "gateway": {"port": 0, "upstreams": [UPSTREAM]},
            "trainer": {"agents": ["planner", "solver"]},
        },
    )
    upstream, sink, lt = LinesVllm(), MemorySink(), LoopThread()
    server = GatewayServer(settings, sink, client=httpx.AsyncClient(transport=httpx.ASGITransport(upstream.app())))
    lt.run(server.start())
    try:
        yield Stack(f"http://127.0.0.1:{server.port}", sink, upstream)
    finally:
        lt.run(server.stop(), timeout=60)
        lt.close()


def _init(agent_name: str | None) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    agentlake.init(exporter=exporter, batch=False, set_global=False, agent_name=agent_name)
    return exporter


@pytest.fixture()
def sdk() -> Iterator[None]:
    yield
    agentlake.uninstrument_openai()
    agentlake.tracer_provider().shutdown()


def test_header_names_are_the_gateways() -> None:
    assert (tracing.ROLLOUT_HEADER, tracing.ATTEMPT_HEADER, tracing.TASK_HEADER, tracing.AGENT_HEADER) == (
        proxy.ROLLOUT_HEADER,
        proxy.ATTEMPT_HEADER,
        proxy.TASK_HEADER,
        proxy.AGENT_HEADER,
    )


def test_init_names_the_agent_and_a_rollout_renames_it(stack: Stack, sdk: None) -> None:
    exporter = _init("planner")
    client = stack.client()
    client.chat.completions.create(model="agentlake-policy", messages=MSGS)  # outside a rollout: init's agent
    model, span = stack.last()
    assert (model, span["attrs"].get(A.AGENT_NAME), span["attrs"].get(A.ROLLOUT_ID)) == (
        "agentlake-policy-planner",
        "planner",
        None,
    )
    assert span["attrs"][A.LLM_POLICY_VERSION] == "agentlake-policy-planner@v0003"

    with agentlake.rollout(task_id="t1", attempt=2) as r:  # the rollout keeps init's agent
        client.chat.completions.create(model="agentlake-policy", messages=MSGS)
    model, span = stack.last()
    assert model == "agentlake-policy-planner"
    assert {k: span["attrs"].get(k) for k in (A.AGENT_NAME, A.ROLLOUT_ID, A.ATTEMPT_ID, A.TASK_ID)} == {
        A.AGENT_NAME: "planner",
        A.ROLLOUT_ID: r.rollout_id,
        A.ATTEMPT_ID: "2",
        A.TASK_ID: "t1",
    }
    (call,) = [s for s in exporter.get_finished_spans() if s.name == A.LLM_CALL_SPAN_NAME][-1:]
    assert span["span"].trace_id.hex() == format(call.context.trace_id, "032x")  # still a child of our call
    assert span["span"].parent_span_id.hex() == format(call.context.span_id, "016x")

    with agentlake.rollout(task_id="t2", agent_name="solver") as r:  # the rollout's own agent wins
        client.chat.completions.create(model="agentlake-policy", messages=MSGS)
        model, span = stack.last()
        assert (model, span["attrs"][A.AGENT_NAME], span["attrs"][A.ROLLOUT_ID]) == (
            "agentlake-policy-solver",
            "solver",
            r.rollout_id,
        )
        r.agent_name = "planner"  # a rollout that hands over to another agent: the next call is the planner's
        client.chat.completions.create(model="agentlake-policy", messages=MSGS)
        assert stack.upstream.seen[-1]["model"] == "agentlake-policy-planner"


def test_a_header_the_caller_set_wins(stack: Stack, sdk: None) -> None:
    _init("planner")
    with agentlake.rollout(task_id="t", rollout_id="r-explicit", agent_name="solver"):
        stack.client().chat.completions.create(
            model="agentlake-policy",
            messages=MSGS,
            extra_headers={"X-Agentlake-Agent": "planner", "x-agentlake-rollout-id": "r-caller"},
        )
        model, span = stack.last()
        assert (model, span["attrs"][A.AGENT_NAME], span["attrs"][A.ROLLOUT_ID]) == (
            "agentlake-policy-planner",
            "planner",
            "r-caller",
        )
        stack.client(default_headers={"x-agentlake-agent": "critic"}).chat.completions.create(
            model="agentlake-policy", messages=MSGS
        )
        model, span = stack.last()  # critic has no line: the single policy serves it, under its name
        assert (model, span["attrs"][A.AGENT_NAME], span["attrs"][A.ROLLOUT_ID]) == (
            "agentlake-policy",
            "critic",
            "r-explicit",
        )


def test_no_agent_header_when_no_agent_is_named(stack: Stack, sdk: None) -> None:
    _init(None)
    assert agentlake.headers() == {}
    with agentlake.rollout(task_id="t", rollout_id="r-anon") as r:
        assert agentlake.headers().keys() == {proxy.ROLLOUT_HEADER, proxy.TASK_HEADER, "traceparent"}
        stack.client().chat.completions.create(model="agentlake-policy", messages=MSGS)
        model, span = stack.last()
        assert (model, span["attrs"].get(A.AGENT_NAME), span["attrs"][A.ROLLOUT_ID]) == (
            "agentlake-policy",
            None,
            r.rollout_id,
        )


def test_async_client_names_the_agent_too(stack: Stack, sdk: None) -> None:
    _init("solver")

    async def call() -> None:
        async with agentlake.rollout(task_id="t"):
            client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="agentlake", max_retries=0)
            await client.chat.completions.create(model="agentlake-policy", messages=MSGS)
            await client.close()

    asyncio.run(call())
    model, span = stack.last()
    assert (model, span["attrs"][A.AGENT_NAME]) == ("agentlake-policy-solver", "solver")


def test_headers_for_raw_http(stack: Stack, sdk: None) -> None:
    _init(None)
    with agentlake.rollout(task_id="t", rollout_id="r-raw", agent_name="planner") as r:
        r.agent_name = "planner\nx-evil: 1"  # no header value: left out, never a broken request
        assert proxy.AGENT_HEADER not in agentlake.headers()
        r.agent_name = "planner"
        sent = agentlake.headers()
        response = httpx.post(
            f"{stack.url}/v1/chat/completions", json={"model": "agentlake-policy", "messages": MSGS}, headers=sent
        )
        assert response.status_code == 200, response.text
    model, span = stack.last()
    assert (model, span["attrs"][A.AGENT_NAME], span["attrs"][A.ROLLOUT_ID], span["attrs"][A.TASK_ID]) == (
        "agentlake-policy-planner",
        "planner",
        "r-raw",
        "t",
    )
    assert r.span is not None and span["span"].parent_span_id.hex() == format(r.span.get_span_context().span_id, "016x")


def test_no_agentlake_headers_to_openai(sdk: None) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        message = {"role": "assistant", "content": "hi"}
        body = {"id": "c", "object": "chat.completion", "created": 0, "model": "gpt", "choices": []}
        return httpx.Response(
            200, json={**body, "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        )

    _init("planner")
    client = openai.OpenAI(api_key="sk", http_client=httpx.Client(transport=httpx.MockTransport(answer)))
    with agentlake.rollout(task_id="t"):
        client.chat.completions.create(model="gpt", messages=MSGS)
    assert not any(k.startswith("x-agentlake-") for k in seen[0].headers)
    assert "traceparent" in seen[0].headers
