"""The agent SDK: public surface, rollout stamping, rewards, OpenAI instrumentation, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentlake
from schemas import attributes as A
from schemas.config import Settings
from tests.collectors.helpers import headers_of, read_topic, running_collector, spans_of


def test_public_api_is_sorted_and_complete() -> None:
    public = {n for n, v in vars(agentlake).items() if not n.startswith("_") and not isinstance(v, type(sys))}
    assert agentlake.__all__ == sorted(agentlake.__all__)
    assert set(agentlake.__all__) == public
    assert {"init", "rollout", "emit_reward", "reward", "instrument_openai"} <= public


def test_import_pulls_no_heavy_packages() -> None:
    code = (
        "import sys, agentlake; heavy = [m for m in ('torch', 'vllm', 'dagster', 'transformers', 'kafka') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    agentlake.init(exporter=exporter, batch=False, set_global=False, instrument_openai=True, agent_name="solver")
    yield exporter
    agentlake.uninstrument_openai()
    agentlake.tracer_provider().shutdown()


def test_rollout_stamps_every_span_and_rewards(spans: InMemorySpanExporter) -> None:
    tracer = agentlake.tracer_provider().get_tracer("some.library")
    with agentlake.rollout(task_id="task-1", attempt=2) as r:
        with tracer.start_as_current_span("tool.call"):
            agentlake.emit_reward(0.25, name="format")
        agentlake.emit_reward(1.0)
    with pytest.raises(ValueError), agentlake.rollout(task_id="task-2", rollout_id="explicit"):
        raise ValueError("agent crashed")
    got = {s.name + str(i): s for i, s in enumerate(spans.get_finished_spans())}
    first = [s for s in got.values() if s.attributes.get(A.TASK_ID) == "task-1"]
    assert len(first) == 4  # rollout, tool, two rewards
    assert {s.attributes[A.ROLLOUT_ID] for s in first} == {r.rollout_id}
    assert r.rollout_id == format(first[0].context.trace_id, "032x")  # default: trace id
    assert all(s.attributes[A.ATTEMPT_ID] == "2" and s.attributes[A.AGENT_NAME] == "solver" for s in first)
    rewards = sorted(
        (s.attributes[A.REWARD_NAME], s.attributes[A.REWARD_VALUE]) for s in first if s.name == A.REWARD_SPAN_NAME
    )
    assert rewards == [("format", 0.25), ("primary", 1.0)]
    root = next(s for s in first if s.name == A.ROLLOUT_SPAN_NAME)
    assert root.attributes[A.ROLLOUT_STATUS] == "finished"
    failed = next(s for s in got.values() if s.attributes.get(A.ROLLOUT_ID) == "explicit")
    assert failed.attributes[A.ROLLOUT_STATUS] == "failed" and failed.status.status_code.name == "ERROR"
    with pytest.raises(agentlake.SdkError, match="rollout_id"):
        agentlake.emit_reward(1.0)


@pytest.mark.anyio
async def test_reward_decorator_sync_and_async(spans: InMemorySpanExporter) -> None:
    @agentlake.reward
    def exact(answer: str) -> float:
        return 1.0 if answer == "42" else 0.0

    @agentlake.reward(name="length")
    async def short(answer: str) -> float:
        return 1.0 / len(answer)

    @agentlake.reward
    def broken() -> str:
        return "yes"

    async with agentlake.rollout(task_id="t"):
        assert exact("42") == 1.0
        assert await short("abcd") == 0.25
        with pytest.raises(agentlake.SdkError, match="not a number"):
            broken()
    values = {
        (s.attributes[A.REWARD_NAME], s.attributes[A.REWARD_VALUE])
        for s in spans.get_finished_spans()
        if s.name == A.REWARD_SPAN_NAME
    }
    assert values == {("primary", 1.0), ("length", 0.25)}


def _vllm_like(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    _vllm_like.seen = body  # type: ignore[attr-defined]
    _vllm_like.headers = dict(request.headers)  # type: ignore[attr-defined]
    lps = {
        "content": [
            {"token": "a", "logprob": -0.1, "bytes": None, "top_logprobs": []},
            {"token": "b", "logprob": -0.2, "bytes": None, "top_logprobs": []},
        ]
    }
    if body.get("stream"):
        chunks = [
            {
                "id": "c9",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "policy-v3",
                "prompt_token_ids": [5, 6, 7],
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}],
            },
            {
                "id": "c9",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "policy-v3",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "ab"},
                        "token_ids": [8, 9],
                        "logprobs": lps,
                        "finish_reason": "stop",
                    }
                ],
            },
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})
    return httpx.Response(
        200,
        json={
            "id": "c9",
            "object": "chat.completion",
            "created": 0,
            "model": "policy-v3",
            "prompt_token_ids": [5, 6, 7],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ab"},
                    "finish_reason": "stop",
                    "logprobs": lps,
                    "token_ids": [8, 9],
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        },
    )


def test_openai_client_asks_vllm_for_ids_and_records_them(spans: InMemorySpanExporter) -> None:
    client = openai.OpenAI(
        base_url="http://vllm.local/v1",
        api_key="x",
        http_client=httpx.Client(transport=httpx.MockTransport(_vllm_like)),
    )
    with agentlake.rollout(task_id="t", rollout_id="r-oa"):
        out = client.chat.completions.create(model="policy-v3", messages=[{"role": "user", "content": "hi"}])
        stream = client.chat.completions.create(
            model="policy-v3", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert out.choices[0].message.content == "ab" and out.choices[0].logprobs is None  # caller did not ask
    assert text == "ab"
    assert _vllm_like.seen["return_token_ids"] is True and _vllm_like.seen["logprobs"] is True  # type: ignore
    calls = [s for s in spans.get_finished_spans() if s.name == A.LLM_CALL_SPAN_NAME]
    assert len(calls) == 2
    # the last request's traceparent names the last call's span: a gateway's span becomes its child
    _, trace_hex, span_hex, _ = _vllm_like.headers["traceparent"].split("-")  # type: ignore[attr-defined]
    assert (int(trace_hex, 16), int(span_hex, 16)) == (calls[-1].context.trace_id, calls[-1].context.span_id)
    for s in calls:
        assert list(s.attributes[A.LLM_PROMPT_TOKEN_IDS]) == [5, 6, 7]
        assert list(s.attributes[A.LLM_COMPLETION_TOKEN_IDS]) == [8, 9]
        assert list(s.attributes[A.LLM_COMPLETION_LOGPROBS]) == pytest.approx([-0.1, -0.2])
        assert s.attributes[A.LLM_SERVED_MODEL] == "policy-v3" and s.attributes[A.ROLLOUT_ID] == "r-oa"
    assert calls[1].attributes[A.LLM_STREAMED] is True


@pytest.mark.kafka
def test_failed_openai_call_is_one_error_on_its_span(spans: InMemorySpanExporter) -> None:
    client = openai.OpenAI(
        base_url="http://vllm.local/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(500, json={"error": "boom"}))),
    )
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="policy-v3", messages=[{"role": "user", "content": "hi"}])
    (call,) = [s for s in spans.get_finished_spans() if s.name == A.LLM_CALL_SPAN_NAME]
    assert call.status.status_code.name == "ERROR"
    assert [e.name for e in call.events] == ["exception"]  # recorded once


def test_end_to_end_into_kafka(settings: Settings) -> None:
    """init -> OTLP/HTTP -> collector -> Kafka, and a late reward through /v1/rewards."""
    with running_collector(settings) as server:
        agentlake.init(f"http://127.0.0.1:{server.http_port}", set_global=False, instrument_openai=False)
        try:
            with agentlake.rollout(task_id="e2e", rollout_id="roll-e2e"):
                agentlake.emit_reward(0.5)
            assert agentlake.flush()
            agentlake.emit_reward(1.0, rollout_id="roll-e2e", event_id="late-1")
        finally:
            agentlake.tracer_provider().shutdown()
    records = read_topic(settings.kafka, settings.kafka.spans_topic, expect=1)
    traces = {trace for trace, _ in spans_of(records)}
    assert len(spans_of(records)) == 2 and {r.key.decode() for r in records} == traces  # keyed by trace id
    (late,) = read_topic(settings.kafka, settings.kafka.rewards_topic, expect=1)
    event = json.loads(late.value)
    assert event["rollout_id"] == "roll-e2e" and event["value"] == 1.0 and headers_of(late)["agentlake-tenant"]


_CALC_TOOL = {
    "type": "function",
    "function": {"name": "calc", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}},
}
_CALLS = [("call_a", "calc", '{"expr": "41*86"}'), ("call_b", "calc", "not json {")]


def _tool_calling_model(request: httpx.Request) -> httpx.Response:
    """A scripted model whose reply is two tool calls (the second's arguments not JSON), streamed in fragments."""
    body = json.loads(request.content)
    if not body.get("stream"):
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in _CALLS]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls", "token_ids": [8, 9]}
        return httpx.Response(
            200,
            json={"id": "c1", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]},
        )
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": None}]
    for index, (call_id, name, arguments) in enumerate(_CALLS):
        deltas.append({"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": {"name": name}}]})
        for piece in (arguments[:3], arguments[3:]):
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    chunks = [
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": d}],
        }
        for d in deltas
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "tool_calls"
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def test_openai_client_records_tool_calls_and_tools_streamed_or_not(spans: InMemorySpanExporter) -> None:
    client = openai.OpenAI(
        base_url="http://vllm.local/v1",
        api_key="x",
        http_client=httpx.Client(transport=httpx.MockTransport(_tool_calling_model)),
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "41*86?"}], "tools": [_CALC_TOOL]}
    client.chat.completions.create(**ask)  # type: ignore[call-overload]
    for _ in client.chat.completions.create(**ask, stream=True):  # type: ignore[call-overload]
        pass
    calls = [s for s in spans.get_finished_spans() if s.name == A.LLM_CALL_SPAN_NAME]
    assert len(calls) == 2
    expected = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in _CALLS
            ],
        }
    ]
    for span in calls:  # the streamed call is recorded as the same call without streaming
        assert json.loads(span.attributes[A.GEN_AI_OUTPUT_MESSAGES]) == expected
        assert json.loads(span.attributes[A.GEN_AI_TOOL_DEFINITIONS]) == [_CALC_TOOL]
