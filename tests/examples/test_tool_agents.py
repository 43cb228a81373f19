"""The three framework tool agents: their own instrumentation's spans keep the native tool calls, the tool
results and (where the instrumentation records them) the tool definitions, through decoding and assembly.

The fast test serves the chat API from an in-memory transport (a scripted model that calls ``calculate``
once, then answers with the tool's result): the spans are the real libraries' output, only the model is
scripted. The slow tests (tests/examples/test_tool_agents_vllm.py) run the same agents on real vLLM.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import Sequence
from types import ModuleType

import httpx
import polars as pl
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from examples.math_agent.tasks import MathTask
from examples.tool_agents import calculator_tool as calc
from examples.tool_agents import langgraph_agent, openai_agents, pydantic_ai_agent
from examples.tool_agents.plumbing import ToolRolloutResult
from pipelines.bronze.decoding import KafkaRecord, SpanBatch
from pipelines.silver.trajectories import assemble

AGENTS = {"openai-agents": openai_agents, "langgraph": langgraph_agent, "pydantic-ai": pydantic_ai_agent}
# OpenInference's Agents SDK instrumentation records no tool definitions on its generation spans
RECORDS_TOOLS = {"openai-agents": False, "langgraph": True, "pydantic-ai": True}


def decode(spans: Sequence[ReadableSpan]) -> pl.DataFrame:
    """Spans -> one OTLP request (what the collector puts on Kafka) -> `spans` rows."""
    batch = SpanBatch()
    assert batch.add(KafkaRecord("agentlake.spans.v1", 0, 0, None, encode_spans(spans).SerializeToString(), [])) > 0
    assert not batch.quarantine, batch.quarantine
    frame = pl.from_arrow(batch.to_table())
    assert isinstance(frame, pl.DataFrame)
    return frame


def llm_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """The rows of model calls: those with output messages."""
    return rows.filter(pl.col("output_messages").is_not_null()).sort("start_time")


def _scripted_model(requests: list[dict[str, object]]) -> httpx.MockTransport:
    """Calls ``calculate`` on the question's two numbers, then answers with what the tool returned."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            message: dict[str, object] = {"role": "assistant", "content": f"ANSWER: {last['content']}"}
        else:
            a, b = re.findall(r"\d+", last["content"])[:2]
            arguments = json.dumps({"expression": f"{a} * {b}"})
            call = {"id": f"call_{a}", "type": "function", "function": {"name": calc.TOOL_NAME, "arguments": arguments}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        reply = {"id": f"chatcmpl-{len(requests)}", "object": "chat.completion", "created": 0, "model": body["model"]}
        return httpx.Response(200, json={**reply, "choices": [choice], "usage": usage})

    return httpx.MockTransport(handle)


def run(
    agent: ModuleType, tasks: list[MathTask], base_url: str, model: str, **kwargs: object
) -> tuple[list[ToolRolloutResult], list[ReadableSpan]]:
    exporter = InMemorySpanExporter()
    agent.setup(exporter=exporter)
    results = asyncio.run(agent.run_batch_async(base_url, tasks, model=model, **kwargs))
    return results, list(exporter.get_finished_spans())


def tool_names(tools_json: str | None) -> list[str]:
    return [t["function"]["name"] for t in json.loads(tools_json or "[]")]


@pytest.mark.parametrize("name", AGENTS)
def test_tool_agent_spans_keep_tool_calls_results_and_definitions(name: str) -> None:
    tasks = [MathTask("tools-1", "What is 69 times 18?", 1242), MathTask("tools-2", "What is 12 times 11?", 132)]
    requests: list[dict[str, object]] = []
    results, spans = run(AGENTS[name], tasks, "http://model.invalid", "policy", transport=_scripted_model(requests))
    assert [(r.reward, r.answer, r.tool_calls, r.error) for r in results] == [
        (1.0, "1242", 1, None),
        (1.0, "132", 1, None),
    ]
    assert all(body["tools"][0]["function"]["name"] == calc.TOOL_NAME for body in requests)  # type: ignore[index]

    calls = llm_rows(decode(spans))
    assert calls.height == len(requests) == 4
    for row in calls.iter_rows(named=True):
        inputs, outputs = json.loads(row["input_messages"]), json.loads(row["output_messages"])
        # the worked example's tool call and result, as the model was shown them
        example = next(m for m in inputs if m.get("tool_calls"))
        (call,) = example["tool_calls"]
        assert call["function"]["name"] == calc.TOOL_NAME and call["id"] == calc.EXAMPLE_CALL_ID
        assert json.loads(call["function"]["arguments"]) == json.loads(calc.EXAMPLE_ARGUMENTS)
        result = next(m for m in inputs if m["role"] == "tool")
        assert (result["tool_call_id"], result["content"]) == (calc.EXAMPLE_CALL_ID, calc.EXAMPLE_RESULT)
        (reply,) = outputs
        assert reply["role"] == "assistant"
        if inputs[-1]["role"] == "tool":  # the second call answers with the tool's result
            assert reply["content"].startswith("ANSWER: ") and not reply.get("tool_calls")
            assert inputs[-2]["tool_calls"][0]["id"] == inputs[-1]["tool_call_id"]
        else:  # the first call asks for the tool
            assert reply["tool_calls"][0]["function"]["name"] == calc.TOOL_NAME
            assert "*" in json.loads(reply["tool_calls"][0]["function"]["arguments"])["expression"]
        if RECORDS_TOOLS[name]:
            assert tool_names(row["tools"]) == [calc.TOOL_NAME]

    trajectories = pl.from_arrow(assemble(decode(spans), now=dt.datetime.now(dt.UTC), idle_timeout_s=60))
    assert isinstance(trajectories, pl.DataFrame)
    got = {
        (r["rollout_id"], r["status"], r["n_llm_calls"], r["final_reward"]) for r in trajectories.iter_rows(named=True)
    }
    assert got == {(r.rollout_id, "finished", 2, 1.0) for r in results}
