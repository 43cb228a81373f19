"""The default stack serves tool-calling agents: vLLM as `start_vllm` starts it, directly and through the gateway.

One template, one place: vLLM's ``/tokenize`` of a history with a tool call and a tool result gives the ids
our retokenizer's tokenizer renders from the same model folder (the shipped template, tools included).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.gateway.proxy import Gateway
from collectors.gateway.routes import create_app
from collectors.sink import MemorySink
from pipelines.gold.retokenize import Retokenizer
from schemas import attributes as A
from schemas.config import load_settings
from tests.fixtures_vllm import VllmServer

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
ASK = [
    {"role": "system", "content": "Use the calc tool for arithmetic."},
    {"role": "user", "content": "What is 41 times 86?"},
]
# a history as an OpenAI client sends it back: the call's arguments as the JSON string vLLM answered with
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "41*86"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "3526"},
]


def _ids(encoded: Any) -> list[int]:  # noqa: ANN401 - a list or a BatchEncoding
    return [int(x) for x in (encoded["input_ids"] if hasattr(encoded, "keys") else encoded)]


def _prompt_ids(sink: MemorySink) -> list[list[int]]:
    """The prompt ids the gateway recorded on each call's span."""
    out = []
    for rec in sink.records:
        for s in ExportTraceServiceRequest.FromString(rec.value).resource_spans[0].scope_spans[0].spans:
            for kv in s.attributes:
                if kv.key == A.LLM_PROMPT_TOKEN_IDS:
                    out.append([v.int_value for v in kv.value.array_value.values])
    return out


async def _through_gateway(upstream: str, body: dict[str, Any]) -> tuple[httpx.Response, MemorySink]:
    settings = load_settings(environ={}, overrides={"gateway": {"upstreams": [upstream]}})
    sink = MemorySink()
    gateway = Gateway(settings, sink)
    transport = httpx.ASGITransport(create_app(gateway))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=300) as client:
            response = await client.post("/v1/chat/completions", json=body)
    finally:
        await gateway.close()
    return response, sink


@pytest.mark.slow
@pytest.mark.vllm
def test_tool_requests_are_served_directly_and_through_the_gateway(vllm_server: VllmServer) -> None:
    tokenizer = Retokenizer(str(vllm_server.model_path)).tokenizer
    for messages in (ASK, HISTORY):
        body = {
            "model": vllm_server.served_name,
            "messages": messages,
            "tools": [CALC],
            "tool_choice": "auto",
            "max_tokens": 8,
            "temperature": 0,
        }
        direct = httpx.post(f"{vllm_server.url}/v1/chat/completions", json=body, timeout=300)
        assert direct.status_code == 200, direct.text
        assert direct.json()["choices"][0]["message"]["role"] == "assistant"
        # a named function too (the hermes parser treats it as "auto": the 135M model's calls are its own text)
        named = {**body, "tool_choice": {"type": "function", "function": {"name": "calc"}}}
        forced = httpx.post(f"{vllm_server.url}/v1/chat/completions", json=named, timeout=300)
        assert forced.status_code == 200, forced.text
        through, sink = asyncio.run(_through_gateway(vllm_server.url, body))
        assert through.status_code == 200, through.text
        # the prompt vLLM served is our template's rendering, tools and the tool call included
        expected = _ids(tokenizer.apply_chat_template(messages, tools=[CALC], add_generation_prompt=True))
        assert _prompt_ids(sink) == [expected]


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_tokenizes_a_tool_history_as_the_retokenizer_does(vllm_server: VllmServer) -> None:
    body = {"model": vllm_server.served_name, "messages": HISTORY, "tools": [CALC], "add_generation_prompt": True}
    response = httpx.post(f"{vllm_server.url}/tokenize", json=body, timeout=120)
    assert response.status_code == 200, response.text
    served = response.json()["tokens"]
    tokenizer = Retokenizer(str(vllm_server.model_path)).tokenizer
    ours = _ids(tokenizer.apply_chat_template(HISTORY, tools=[CALC], add_generation_prompt=True))
    assert served == ours
    text = tokenizer.decode(served)
    assert '<tools>\n{"type": "function", "function": {"name": "calc"' in text
    assert '<tool_call>\n{"name": "calc", "arguments": {"expr": "41*86"}}\n</tool_call><|im_end|>' in text
    assert text.endswith("<tool_response>\n3526\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
