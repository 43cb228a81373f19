"""The framework tool agents on real vLLM (the default stack: the shipped tool template, the hermes parser),
once through the gateway and once straight to vLLM.

Through the gateway every call's transition carries the engine's exact ids. Straight to vLLM the lake has
only the framework's messages: retokenized with the served template, tools included, they must give the
prompt ids vLLM itself reported for that request (a recording transport asks vLLM for ``return_token_ids``,
an independent reference the agent never sees).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from types import ModuleType
from typing import Any

import httpx
import polars as pl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.gateway.proxy import Gateway
from collectors.gateway.routes import create_app
from collectors.sink import MemorySink
from examples.tool_agents import calculator_tool as calc
from examples.tool_agents.plumbing import heldout_tasks
from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.transitions import build
from pipelines.silver.trajectories import assemble
from schemas.config import CreditSettings, load_settings
from tests.collectors.helpers import span_rows
from tests.examples.test_tool_agents import AGENTS, RECORDS_TOOLS, decode, llm_rows
from tests.fixtures_vllm import VllmServer


class RecordingTransport(httpx.AsyncBaseTransport):
    """Forwards to vLLM asking for ``return_token_ids``, and keeps each request's tools and the ids vLLM reports."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        body["return_token_ids"] = True
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        upstream = httpx.Request(request.method, request.url, headers=headers, json=body)
        response = await self.inner.handle_async_request(upstream)
        content = await response.aread()
        reply = json.loads(content)
        choice = reply["choices"][0]
        self.seen.append(
            {
                "tools": body.get("tools"),
                "prompt_ids": reply["prompt_token_ids"],
                "completion_ids": choice["token_ids"],
                "finish_reason": choice["finish_reason"],
            }
        )
        keep = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return httpx.Response(response.status_code, headers=keep, content=content)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _run(agent: ModuleType, base_url: str, model: str, transport: httpx.AsyncBaseTransport) -> list[Any]:
    """Two held-out tasks, one at a time (calls in request order), greedy; the agent's finished spans."""
    exporter = InMemorySpanExporter()
    agent.setup(exporter=exporter)
    tasks = heldout_tasks(2)
    await agent.run_batch_async(base_url, tasks, model=model, concurrency=1, temperature=0.0, transport=transport)
    return list(exporter.get_finished_spans())


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("name", AGENTS)
def test_retokenized_tool_prompts_are_what_vllm_served(name: str, vllm_server: VllmServer) -> None:
    recorder = RecordingTransport()
    spans = asyncio.run(_run(AGENTS[name], vllm_server.url, vllm_server.served_name, recorder))
    calls = llm_rows(decode(spans))
    assert calls.height == len(recorder.seen) >= 2
    retokenizer = Retokenizer(str(vllm_server.model_path))
    for row, seen in zip(calls.iter_rows(named=True), recorder.seen, strict=True):
        assert any(m.get("tool_calls") for m in json.loads(row["input_messages"]))  # the worked example's call
        tools = row["tools"] if RECORDS_TOOLS[name] else json.dumps(seen["tools"])
        encoded = retokenizer.encode(row["input_messages"], row["output_messages"], tools)
        assert encoded is not None
        prompt, response = encoded
        assert prompt == seen["prompt_ids"]
        if seen["finish_reason"] in ("stop", "tool_calls"):  # a reply cut by max_tokens has no end of turn
            assert response == seen["completion_ids"]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("name", AGENTS)
def test_tool_agent_through_the_gateway_gives_exact_transitions(name: str, vllm_server: VllmServer) -> None:
    settings = load_settings(environ={}, overrides={"gateway": {"upstreams": [vllm_server.url]}})
    sink = MemorySink()

    async def run_through_gateway() -> list[Any]:
        gateway = Gateway(settings, sink)
        try:
            transport = httpx.ASGITransport(create_app(gateway))
            return await _run(AGENTS[name], "http://gateway", vllm_server.served_name, transport)
        finally:
            await gateway.close()

    spans = asyncio.run(run_through_gateway())
    agent_rows = decode(spans)
    gateway_rows = span_rows(sink)
    assert gateway_rows.height >= 2
    assert all(json.loads(t)[0]["function"]["name"] == calc.TOOL_NAME for t in gateway_rows["tools"])
    rows = pl.concat([agent_rows, gateway_rows], how="vertical_relaxed")
    trajectories = pl.from_arrow(assemble(rows, now=dt.datetime.now(dt.UTC), idle_timeout_s=60))
    assert isinstance(trajectories, pl.DataFrame) and trajectories.height == 2
    result = build(trajectories, CreditSettings(), now=dt.datetime.now(dt.UTC))
    transitions = pl.from_arrow(result.table)
    assert isinstance(transitions, pl.DataFrame) and transitions.height >= 2
    assert set(transitions["token_source"]) == {"exact"}
    assert transitions["merged_calls"].sum() == gateway_rows.height


class SyncRecordingTransport(httpx.BaseTransport):
    """``RecordingTransport`` for a synchronous client (the native agent's)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read())
        body["return_token_ids"] = True
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        response = self.inner.handle_request(httpx.Request(request.method, request.url, headers=headers, json=body))
        content = response.read()
        reply = json.loads(content)
        choice = reply["choices"][0]
        self.seen.append(
            {
                "request": body,
                "prompt_ids": reply["prompt_token_ids"],
                "completion_ids": choice["token_ids"],
                "finish_reason": choice["finish_reason"],
                "message": choice["message"],
            }
        )
        keep = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return httpx.Response(response.status_code, headers=keep, content=content)


@pytest.mark.slow
@pytest.mark.vllm
def test_the_native_agent_calls_its_tool_first_and_its_tokens_retokenize_exactly(vllm_server: VllmServer) -> None:
    """`agentlake demo --agent tools`: the first turn names the calculator, so every rollout calls it (the base
    model never does on "auto"); the call is the model's hermes text, so the template renders the text vLLM
    generated. The ids too, except where the grammar that holds the call's frame let the model spell a word in
    other tokens than the tokenizer would ("calcul" + "ate"): such replies decode to the same text and are
    counted; the gateway, which records the engine's ids, is what trains on them exactly."""
    from examples.tool_agents import native

    recorder = SyncRecordingTransport()
    retokenizer = Retokenizer(str(vllm_server.model_path))
    with httpx.Client(base_url=vllm_server.url, transport=recorder, timeout=120) as client:
        results = [
            native.run_rollout(client, task, model=vllm_server.served_name, temperature=0.7, seed=100 + i)
            for i, task in enumerate(heldout_tasks(4))
        ]
    assert all(r.tool_calls >= 1 for r in results)
    firsts = [s for s in recorder.seen if s["request"]["tool_choice"] != "auto"]
    assert len(firsts) == len(results)
    assert all(s["request"]["tool_choice"] == native.REQUIRE_CALCULATE for s in firsts)
    later = [s for s in recorder.seen if s["request"]["tool_choice"] == "auto"]
    assert later, "no rollout went on after its tool result"
    respelled = 0
    for seen in recorder.seen:
        message = seen["message"]
        output: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            output["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": c["function"]} for c in message["tool_calls"]
            ]
        encoded = retokenizer.encode(seen["request"]["messages"], [output], seen["request"]["tools"])
        assert encoded is not None
        prompt, response = encoded
        assert prompt == seen["prompt_ids"]
        generated = seen["completion_ids"]
        if seen["finish_reason"] not in ("stop", "tool_calls"):  # cut by max_tokens: no end of turn to compare
            continue
        canonical = retokenizer.tokenizer.encode(retokenizer.tokenizer.decode(generated), add_special_tokens=False)
        if canonical == generated:
            assert response == generated
        else:
            respelled += 1
            assert retokenizer.tokenizer.decode(response) == retokenizer.tokenizer.decode(generated)
    assert respelled < len(recorder.seen), "every reply was spelled in other tokens: nothing compared exactly"
