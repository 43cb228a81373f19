"""The Responses API (``POST /v1/responses``) on real vLLM (the default stack: the shipped tool template, the
hermes parser), straight and through the gateway.

vLLM 0.32 serves it with function tools, streamed and not, and returns the exact prompt and completion ids
when asked for ``enable_response_messages``. The gateway records each call as a chat call: its items
converted to chat messages the way vLLM converts them, so the template renders those messages to the very
prompt vLLM served (the pipeline's exact-token check), which a generated history checks here too.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import httpx
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.gateway import responses_api as R
from collectors.gateway.proxy import Gateway
from collectors.gateway.routes import create_app
from collectors.sink import MemorySink
from examples.tool_agents import calculator_tool as calc
from examples.tool_agents import openai_agents
from examples.tool_agents.plumbing import heldout_tasks
from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.transitions import build
from pipelines.silver.trajectories import assemble
from schemas.config import CreditSettings, load_settings
from tests.collectors.helpers import span_rows
from tests.collectors.responses_items import TOOL, responses_request
from tests.examples.test_tool_agents import decode
from tests.fixtures_vllm import VllmServer

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def retokenizer(vllm_server: VllmServer) -> Retokenizer:
    return Retokenizer(str(vllm_server.model_path))


def test_converted_items_render_the_prompt_vllm_served(vllm_server: VllmServer, retokenizer: Retokenizer) -> None:
    """Generated histories (text, single and parallel calls, tool outputs, several turns, instructions, tools):
    the template over the converted messages gives vLLM's own prompt ids for the Responses request."""
    client = httpx.Client(base_url=vllm_server.url, timeout=60)

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(responses_request())
    def check(body: dict[str, Any]) -> None:
        sent = {**R.upstream_body(body), "model": vllm_server.served_name, "max_output_tokens": 1}
        r = client.post("/v1/responses", json=sent)
        assert r.status_code == 200, r.text[:500]
        prompt, completion = R.token_ids(r.json())
        assert prompt is not None and completion
        tools = R.chat_tools(body.get("tools"))
        messages = json.dumps(R.input_messages(body))
        assert retokenizer.prompt_ids(messages, json.dumps(tools) if tools else None) == prompt

    try:
        check()
    finally:
        client.close()


def test_a_tool_call_through_the_gateway_is_recorded_the_same_streamed_or_not(
    vllm_server: VllmServer, retokenizer: Retokenizer
) -> None:
    """A named function call, greedy, once whole and once streamed: both calls record vLLM's exact ids, the
    same tool call, and messages whose rendering is the prompt vLLM served; a body vLLM refuses is its 4xx."""
    settings_ = load_settings(environ={}, overrides={"gateway": {"upstreams": [vllm_server.url]}})
    sink = MemorySink()
    body = {
        "model": vllm_server.served_name,
        "instructions": calc.AGENT_SYSTEM_PROMPT,
        "input": [*openai_agents.worked_example(), {"role": "user", "content": "What is 17 times 3?"}],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "calculate"},
        "temperature": 0,
        "max_output_tokens": 40,
    }

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
        gateway = Gateway(settings_, sink)
        try:
            transport = httpx.ASGITransport(create_app(gateway))
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=120) as c:
                plain = await c.post("/rollout/r-1/v1/responses", json=body)
                streamed = await c.post("/rollout/r-1/v1/responses", json={**body, "stream": True})
                refused = await c.post("/v1/responses", json={**body, "input": [{"type": "no_such_item"}]})
                again = await c.post("/v1/responses", json={**body, "max_output_tokens": 2})
                return plain, streamed, refused, again
        finally:
            await gateway.close()

    plain, streamed, refused, again = asyncio.run(go())
    assert plain.status_code == streamed.status_code == again.status_code == 200
    assert 400 <= refused.status_code < 500 and "no_such_item" in refused.text
    assert [i["type"] for i in plain.json()["output"]] == ["function_call"]
    assert "response.completed" in streamed.text and "input_messages" not in plain.json()
    rows = span_rows(sink).filter(pl.col("rollout_id") == "r-1")
    assert rows.height == 2
    recorded = []
    for row in rows.iter_rows(named=True):
        assert row["prompt_token_ids"] and row["completion_token_ids"]
        assert retokenizer.prompt_ids(row["input_messages"], row["tools"]) == list(row["prompt_token_ids"])
        (out,) = json.loads(row["output_messages"])
        assert out["tool_calls"][0]["function"]["name"] == calc.TOOL_NAME
        recorded.append((row["input_messages"], list(row["prompt_token_ids"]), list(row["completion_token_ids"])))
    assert recorded[0] == recorded[1]


def test_the_agents_sdk_on_the_responses_api_through_the_gateway_gives_exact_transitions(
    vllm_server: VllmServer, retokenizer: Retokenizer
) -> None:
    settings_ = load_settings(environ={}, overrides={"gateway": {"upstreams": [vllm_server.url]}})
    sink = MemorySink()

    async def run() -> list[Any]:
        gateway = Gateway(settings_, sink)
        exporter = InMemorySpanExporter()
        openai_agents.setup(exporter=exporter)
        try:
            await openai_agents.run_batch_async(
                "http://gateway",
                heldout_tasks(2),
                model=vllm_server.served_name,
                concurrency=1,
                temperature=0.0,
                transport=httpx.ASGITransport(create_app(gateway)),
                responses=True,
            )
        finally:
            await gateway.close()
        return list(exporter.get_finished_spans())

    agent_rows, spans = decode(asyncio.run(run())), span_rows(sink)
    assert spans.height >= 2
    assert all(json.loads(t)[0]["function"]["name"] == calc.TOOL_NAME for t in spans["tools"])
    for row in spans.iter_rows(named=True):  # the worked example's call is in every history, as a tool call
        assert any(m.get("tool_calls") for m in json.loads(row["input_messages"]))
    rows = pl.concat([agent_rows, spans], how="vertical_relaxed")
    trajectories = pl.from_arrow(assemble(rows, now=dt.datetime.now(dt.UTC), idle_timeout_s=60))
    assert isinstance(trajectories, pl.DataFrame) and trajectories.height == 2
    result = build(trajectories, CreditSettings(), now=dt.datetime.now(dt.UTC), retokenizer=retokenizer)
    transitions = pl.from_arrow(result.table)
    assert isinstance(transitions, pl.DataFrame) and transitions.height >= 2
    assert set(transitions["token_source"]) == {"exact"}
    assert set(transitions["token_status"]) == {"exact"}  # the template over the messages is vLLM's prompt
    assert transitions["merged_calls"].sum() == spans.height
