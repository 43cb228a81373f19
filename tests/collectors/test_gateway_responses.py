"""The Responses API through the gateway, without a server: the items -> chat conversion (vLLM's merging
rules), the recorded span a scripted upstream's answer becomes, streamed and not, and bodies refused 400.
(That the conversion renders what vLLM renders is tests/examples/test_responses_vllm.py, on real vLLM.)"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.gateway import responses_api as R
from collectors.gateway.proxy import Gateway
from collectors.sink import MemorySink
from schemas.config import load_settings
from tests.collectors.helpers import span_rows
from tests.collectors.responses_items import TOOL, responses_request
from tests.collectors.test_gateway import anyio_backend, client_for, settle

__all__ = ["anyio_backend"]  # the fixture, on asyncio

CALL = {"type": "function_call", "call_id": "c1", "name": "calculate", "arguments": '{"expression": "2*3"}'}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "6"}


def test_items_become_chat_messages_merged_as_vllm_merges_them() -> None:
    said = {"id": "m1", "type": "message", "role": "assistant", "status": "completed"}
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "2*3?"}]},
            {**said, "content": [{"type": "output_text", "text": "Let me see.", "annotations": []}]},
            CALL,
            {**CALL, "call_id": "c2"},
            OUTPUT,
            {**OUTPUT, "call_id": "c2"},
            CALL,
            {"role": "assistant", "content": "It is 6."},  # fills the tool-calling turn with no text yet
        ],
    }
    call = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": CALL["arguments"]}}
    assert R.input_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2*3?"},
        {"role": "assistant", "content": "Let me see.", "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "content": "6", "tool_call_id": "c1"},
        {"role": "tool", "content": "6", "tool_call_id": "c2"},
        {"role": "assistant", "tool_calls": [call], "content": "It is 6."},
    ]
    assert R.input_messages({"input": "hi"}) == [{"role": "user", "content": "hi"}]
    assert R.chat_tools([TOOL, {"type": "web_search"}]) == [
        {"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters", "strict")}}
    ]


def test_the_answer_becomes_one_assistant_message_with_its_calls_and_exact_ids() -> None:
    data = {
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}, CALL],
        "input_messages": [{"type": "raw_message_tokens", "message": "p", "tokens": [1, 2]}],
        "output_messages": [{"type": "raw_message_tokens", "message": "r", "tokens": [3, 2]}],
        "usage": {"input_tokens": 2, "output_tokens": 2},
    }
    assert R.output_message(data) == {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": CALL["arguments"]}}
        ],
    }
    assert R.token_ids(data) == ([1, 2], [3, 2])
    assert R.finish_reason(data) == "tool_calls" and R.finish_reason({"status": "incomplete"}) == "length"
    assert R.token_ids({"input_messages": [{"role": "user"}]}) == (None, None)  # harmony messages: no ids
    assert R.strip(dict(data), asked=False).keys().isdisjoint({"input_messages", "output_messages"})


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(list(CALL) + ["role", "content", "input", "tools", "output"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(responses_request(), st.dictionaries(st.sampled_from(["input", "instructions", "tools", "model"]), junk))
)
def test_the_conversion_is_total_over_any_body(body: dict[str, Any]) -> None:
    """Any JSON body: the conversion gives chat messages (or none) and never raises."""
    R.problem(body)
    messages = R.input_messages(body)
    assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    R.chat_tools(body.get("tools"))
    R.output_message({"output": body.get("input")})
    json.dumps(messages)


ANSWER = {
    "id": "resp_1",
    "object": "response",
    "model": "policy",
    "status": "completed",
    "output": [
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c9",
            "name": "calculate",
            "arguments": '{"expression": "5*6"}',
        }
    ],
    "usage": {"input_tokens": 3, "output_tokens": 2},
    "input_messages": [{"type": "raw_message_tokens", "message": "p", "tokens": [5, 6, 7]}],
    "output_messages": [{"type": "raw_message_tokens", "message": "r", "tokens": [8, 2]}],
}


def _upstream(seen: list[dict[str, Any]]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "policy"}]})
        body = json.loads(request.content)
        seen.append(body)
        if not body.get("stream"):
            return httpx.Response(200, json=ANSWER)
        events = [
            (
                "response.created",
                {"type": "response.created", "response": {**ANSWER, "output": [], "status": "in_progress"}},
            ),
            (
                "response.function_call_arguments.delta",
                {"type": "response.function_call_arguments.delta", "delta": "{"},
            ),
            ("response.completed", {"type": "response.completed", "response": ANSWER}),
        ]
        text = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events)
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


@pytest.mark.anyio
async def test_a_responses_call_is_recorded_like_a_chat_call_streamed_or_not() -> None:
    seen: list[dict[str, Any]] = []
    sink = MemorySink()
    gateway = Gateway(
        load_settings(environ={}, overrides={"gateway": {"upstreams": ["http://vllm"]}}), sink, client=_upstream(seen)
    )
    body = {
        "model": "policy",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "5*6?"}],
        "tools": [TOOL],
    }
    async with client_for(gateway) as c:
        plain = await c.post("/rollout/r1/v1/responses", json=body)
        streamed = await c.post("/rollout/r1/v1/responses", json={**body, "stream": True})
    assert plain.status_code == streamed.status_code == 200
    assert "input_messages" not in plain.json() and plain.json()["output"] == ANSWER["output"]
    assert streamed.text.count("event: ") == 3 and '"input_messages"' not in streamed.text
    assert all(s["enable_response_messages"] is True for s in seen)
    await settle(gateway)
    rows = span_rows(sink)
    assert rows.height == 2 and rows["rollout_id"].to_list() == ["r1", "r1"]
    for row in rows.iter_rows(named=True):
        assert list(row["prompt_token_ids"]) == [5, 6, 7] and list(row["completion_token_ids"]) == [8, 2]
        assert json.loads(row["input_messages"]) == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "5*6?"},
        ]
        (out,) = json.loads(row["output_messages"])
        assert out["tool_calls"][0]["function"]["name"] == "calculate" and out["tool_calls"][0]["id"] == "c9"
        assert json.loads(row["tools"])[0]["function"]["name"] == "calculate"
    await gateway.close()


@pytest.mark.anyio
async def test_malformed_bodies_get_400_with_the_reason_and_the_gateway_keeps_serving() -> None:
    seen: list[dict[str, Any]] = []
    gateway = Gateway(
        load_settings(environ={}, overrides={"gateway": {"upstreams": ["http://vllm"]}}),
        MemorySink(),
        client=_upstream(seen),
    )
    bad = [
        ({"model": "policy", "input": 5}, "input must be"),
        ({"model": "policy", "input": [3]}, "input[0] must be an object"),
        ({"model": "policy", "input": [{"call_id": "x"}]}, "neither a role nor a type"),
        ({"model": "policy", "input": "hi", "tools": {"name": "x"}}, "tools must be a list"),
        ({"input": "hi"}, "model must be"),
        ({"model": "policy", "input": "hi", "instructions": ["x"]}, "instructions must be"),
    ]
    async with client_for(gateway) as c:
        for body, reason in bad:
            r = await c.post("/v1/responses", json=body)
            assert r.status_code == 400 and reason in r.json()["error"]["message"], r.text
        r = await c.post("/v1/responses", content=b"{not json")
        assert r.status_code == 400
        assert (await c.post("/v1/responses", json={"model": "policy", "input": "hi"})).status_code == 200
    assert len(seen) == 1  # only the good body reached the upstream
    await gateway.close()
