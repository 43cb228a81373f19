"""The OpenAI Agents SDK agent: its OpenInference spans go through our decoder and trajectory assembly as they are.

The fast test serves the chat API from an in-memory transport (a scripted model) to check the
agent loop, the headers it sends and the span shapes; the slow test runs the same agent against
real vLLM.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence

import httpx
import polars as pl
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.gateway.proxy import AGENT_HEADER, ROLLOUT_HEADER
from examples.framework_agent.agent import AGENT_NAME, RolloutResult, heldout_tasks, run_batch, setup
from examples.math_agent.tasks import MathTask
from pipelines.bronze.decoding import KafkaRecord, SpanBatch
from pipelines.silver.trajectories import assemble
from schemas import attributes as A


def _decode(spans: Sequence[ReadableSpan]) -> pl.DataFrame:
    """Spans -> one OTLP request (what the collector puts on Kafka) -> `spans` rows."""
    batch = SpanBatch()
    assert batch.add(KafkaRecord("agentlake.spans.v1", 0, 0, None, encode_spans(spans).SerializeToString(), [])) > 0
    assert not batch.quarantine, batch.quarantine
    frame = pl.from_arrow(batch.to_table())
    assert isinstance(frame, pl.DataFrame)
    return frame


def _check_pipeline_accepts(spans: Sequence[ReadableSpan], results: list[RolloutResult]) -> pl.DataFrame:
    """LLM rows carry messages and the rollout ids; trajectories count the calls and carry the reward."""
    rows = _decode(spans)
    llm = rows.filter(pl.col("attributes").str.contains(f'"{A.OI_SPAN_KIND}": "LLM"'))
    assert llm.height == sum(r.calls for r in results)
    for row in llm.iter_rows(named=True):
        inputs, outputs = json.loads(row["input_messages"]), json.loads(row["output_messages"])
        assert inputs[0]["role"] == "system" and inputs[-1]["role"] == "user" and inputs[-1]["content"]
        assert outputs[0]["role"] == "assistant" and outputs[0]["content"]
        assert row["agent_name"] == AGENT_NAME and row["llm_model"]
    by_rollout = {r.rollout_id: r for r in results}
    assert set(llm["rollout_id"]) == set(by_rollout)
    for row in llm.iter_rows(named=True):
        assert row["task_id"] == by_rollout[row["rollout_id"]].task_id
    traj = pl.from_arrow(assemble(rows, now=dt.datetime.now(dt.UTC), idle_timeout_s=60))
    assert isinstance(traj, pl.DataFrame) and traj.height == len(results)
    for row in traj.iter_rows(named=True):
        r = by_rollout[row["rollout_id"]]
        assert (row["status"], row["task_id"], row["n_llm_calls"], row["final_reward"]) == (
            "finished",
            r.task_id,
            r.calls,
            r.reward,
        )
    return llm


def _scripted_model(requests: list[httpx.Request]) -> httpx.MockTransport:
    """A chat endpoint that asks for the product once, then answers with the calculator's result."""

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        body = json.loads(request.content)
        last = body["messages"][-1]["content"]
        if last.startswith("RESULT: "):
            text = "ANSWER: " + last.removeprefix("RESULT: ")
        else:
            a, b = re.findall(r"\d+", last)[:2]
            text = f"CALC: {a} * {b}"
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{len(requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            },
        )

    return httpx.MockTransport(handle)


def test_framework_agent_loop_headers_and_spans() -> None:
    exporter = InMemorySpanExporter()
    setup(exporter=exporter)
    requests: list[httpx.Request] = []
    tasks = [MathTask("fw-1", "What is 69 times 18?", 1242), MathTask("fw-2", "What is 12 times 11?", 132)]
    model = _scripted_model(requests)
    results = run_batch("http://model.invalid", tasks, model="policy", concurrency=2, transport=model)
    assert [(r.reward, r.answer, r.calls) for r in results] == [(1.0, "1242", 2), (1.0, "132", 2)]
    assert len(requests) == 4
    spans = exporter.get_finished_spans()
    roots = {s.attributes[A.ROLLOUT_ID]: s for s in spans if s.name == A.ROLLOUT_SPAN_NAME}
    llm_span_ids = {format(s.context.span_id, "016x") for s in spans if s.attributes.get(A.OI_SPAN_KIND) == "LLM"}
    for request in requests:
        body = json.loads(request.content)
        assert "tools" not in body and body["stop"] == ["\nRESULT", "RESULT:"]
        rollout_id = request.headers[ROLLOUT_HEADER]
        assert request.headers[AGENT_HEADER] == AGENT_NAME  # the SDK names the agent (its policy line)
        _, trace_id, parent_id, _ = request.headers["traceparent"].split("-")
        assert trace_id == format(roots[rollout_id].context.trace_id, "032x")
        assert parent_id in llm_span_ids  # a gateway's span would hang under the framework's LLM span
    _check_pipeline_accepts(spans, results)


@pytest.mark.slow
def test_framework_agent_against_real_vllm(vllm_server) -> None:  # noqa: ANN001 - session fixture
    """The framework agent on real vLLM: its OpenInference LLM spans decode into calls with messages."""
    exporter = InMemorySpanExporter()
    setup(exporter=exporter)
    tasks = heldout_tasks(3)
    results = run_batch(vllm_server.url, tasks, model=vllm_server.served_name, concurrency=2, temperature=0.0)
    assert [r.task_id for r in results] == [t.task_id for t in tasks]
    assert all(0.0 <= r.reward <= 1.0 and r.calls >= 1 for r in results)
    llm = _check_pipeline_accepts(exporter.get_finished_spans(), results)
    assert set(llm["llm_model"]) == {vllm_server.served_name}
