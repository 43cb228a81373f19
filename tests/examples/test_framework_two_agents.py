"""The two-agent framework example (issue 13): each agent's calls name it, in headers and in spans."""

from __future__ import annotations

import json
import re

import httpx
import polars as pl

from collectors.gateway.proxy import AGENT_HEADER
from examples.framework_agent.agent import setup
from examples.framework_agent.two_agents import PLANNER, PLANNER_PROMPT, SOLVER, run_batch
from examples.math_agent.tasks import MathTask
from schemas import attributes as A
from tests.examples.test_framework_agent import _decode


def _scripted(requests: list[httpx.Request]) -> httpx.MockTransport:
    """The planner states the product; the solver asks the calculator once, then answers."""

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        body = json.loads(request.content)
        last = body["messages"][-1]["content"]
        if body["messages"][0]["content"] == PLANNER_PROMPT:
            a, b = re.findall(r"\d+", last)[:2]
            text = f"multiply {a} by {b}"
        elif last.startswith("RESULT: "):
            text = "ANSWER: " + last.removeprefix("RESULT: ")
        else:
            assert "\nPlan: multiply " in last  # the solver sees the planner's line
            a, b = re.findall(r"\d+", last)[:2]
            text = f"CALC: {a} * {b}"
        message = {"role": "assistant", "content": text}
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{len(requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            },
        )

    return httpx.MockTransport(handle)


def test_planner_and_solver_calls_name_their_agent() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    setup(exporter=exporter)
    requests: list[httpx.Request] = []
    tasks = [MathTask("two-1", "What is 69 times 18?", 1242), MathTask("two-2", "What is 12 times 11?", 132)]
    results = run_batch("http://model.invalid", tasks, concurrency=2, transport=_scripted(requests))
    assert [(r.reward, r.answer, r.calls) for r in results] == [(1.0, "1242", 3), (1.0, "132", 3)]

    by_agent: dict[str, int] = {}
    for request in requests:
        body = json.loads(request.content)
        assert body["model"] == "agentlake-policy"  # one served name; the gateway routes by the header
        agent = request.headers[AGENT_HEADER]
        assert agent == (PLANNER if body["messages"][0]["content"] == PLANNER_PROMPT else SOLVER)
        by_agent[agent] = by_agent.get(agent, 0) + 1
    assert by_agent == {PLANNER: 2, SOLVER: 4}

    rows = _decode(exporter.get_finished_spans())
    llm = rows.filter(pl.col("attributes").str.contains(f'"{A.OI_SPAN_KIND}": "LLM"'))
    counts = dict(llm.group_by("agent_name").len().iter_rows())
    assert counts == {PLANNER: 2, SOLVER: 4}
