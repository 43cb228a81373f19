"""Exact retokenization against real vLLM: for generated histories with tools, the retokenizer's prompt is
vLLM's ``prompt_token_ids`` and its response, from the reply vLLM parsed into a message, is the completion's
``token_ids``; and a retokenized call is ``verified`` by the server's ``/tokenize``.

What is comparable: a reply that ended (finish_reason "stop") ends at ``<|im_end|>`` and must equal the
retokenized response whole; a reply cut by ``max_tokens`` ("length") has no end-of-turn token, so it must
equal the retokenized response less its ``<|im_end|>``. A tool call the model wrote in another JSON spacing
than the template's cannot be recovered from the parsed message (the hermes parser re-dumps the
arguments); such replies must still parse back to the same calls, and are counted, not compared.
A reply whose text the retokenizer gives exactly, but which the model sampled in another split into tokens
than the tokenizer's own (say "f" + "x" where the tokenizer writes "fx"), is counted, not compared: no
retokenizer can recover it from text; the retokenized ids must then be the tokenizer's split of that text.

Streaming: the gateway records a streamed answer with tool calls as the same request unstreamed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.sink import MemorySink
from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.token_check import MISMATCH, VERIFIED, TokenizeEndpoint, status
from schemas import attributes as A
from tests.fixtures_vllm import VllmServer
from tests.pipelines.test_retokenize_exact import HERMES, TOOLS, histories
from tests.stack.test_vllm_tools import _through_gateway

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _reply_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The output message an OpenAI client records from vLLM's parsed reply."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": c["function"]} for c in message["tool_calls"]
        ]
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    return [out]


def compare(
    retok: Retokenizer,
    enc: tuple[list[int], list[int]] | None,
    served: tuple[list[int], list[int]],
    finish: str,
    output: list[dict[str, Any]],
) -> str:
    """The retokenized (prompt, response) ``enc`` against vLLM's ``served`` (prompt ids, completion ids) of a
    reply that finished with ``finish`` and was recorded as ``output``; returns how the response compared:
    the finish reason, or "tool_call_reserialized" (the rules in this module's docstring)."""
    assert enc is not None
    prompt, response = enc
    served_prompt, served_response = served
    assert prompt == served_prompt, (retok.tokenizer.decode(prompt), retok.tokenizer.decode(served_prompt))
    eot = retok.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert response[-1] == eot
    if finish == "stop":
        assert served_response[-1] == eot  # vLLM's ids end at the end-of-turn token, no newline after
        comparable = response
    else:
        comparable = response[:-1]
    if comparable == served_response:
        return finish
    if retok.tokenizer.decode(comparable) == retok.tokenizer.decode(served_response):
        # the same text in another split than the tokenizer's own: the model sampled a non-canonical
        # tokenization, which no retokenizer can recover from text (the reason exact capture exists)
        assert retok.ids(retok.tokenizer.decode(served_response)) == comparable
        return "non_canonical_split"
    # only a tool call in the model's own JSON spacing may differ, and it must parse to the same calls
    assert output[0].get("tool_calls"), (retok.tokenizer.decode(comparable), retok.tokenizer.decode(served_response))
    raw = [json.loads(a or b) for a, b in HERMES.findall(retok.tokenizer.decode(served_response))]
    assert [(c["name"], c["arguments"]) for c in raw] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in output[0]["tool_calls"]
    ]
    return "tool_call_reserialized"


def _check(server: VllmServer, retok: Retokenizer, messages: list[dict[str, Any]], tools: Any) -> str:  # noqa: ANN401
    """Ask vLLM, retokenize the exchange, compare; returns how the response compared."""
    body: dict[str, Any] = {
        "model": server.served_name,
        "messages": messages,
        "max_tokens": 24,
        "temperature": 0,
        "return_token_ids": True,
    }
    if tools:
        body |= {"tools": tools, "tool_choice": "auto"}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    choice = data["choices"][0]
    served = (data.get("prompt_token_ids") or choice.get("prompt_token_ids"), choice["token_ids"])
    output = _reply_messages(choice["message"])
    enc = retok.encode(json.dumps(messages), json.dumps(output), json.dumps(tools) if tools else None)
    return compare(retok, enc, served, choice["finish_reason"], output)


def test_a_finished_reply_and_tool_history_retokenize_as_vllm_served_them(vllm_server: VllmServer) -> None:
    retok = Retokenizer(str(vllm_server.model_path))
    hi = [{"role": "user", "content": "Say hi."}]
    assert _check(vllm_server, retok, hi, None) == "stop"
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the calc tool for arithmetic."},
        {"role": "user", "content": "What is 41 times 86?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"expr":"41*86"}'}},
                {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "3526"},
        {"role": "tool", "tool_call_id": "b", "content": "nothing"},
    ]
    _check(vllm_server, retok, history, TOOLS)
    # the served model's /tokenize verifies what the retokenizer renders; another template is a mismatch
    verify = TokenizeEndpoint(vllm_server.url, vllm_server.served_name, timeout_s=30)
    prompt = retok.prompt_ids(json.dumps(history), json.dumps(TOOLS))
    assert status(prompt, verify(json.dumps(history), json.dumps(TOOLS))) == VERIFIED
    assert status(retok.prompt_ids(json.dumps(history)), verify(json.dumps(history), json.dumps(TOOLS))) == MISMATCH


@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories())
def test_generated_histories_retokenize_as_vllm_served_them(vllm_server: VllmServer, history: Any) -> None:  # noqa: ANN401
    messages, _, tools = history
    _check(vllm_server, Retokenizer(str(vllm_server.model_path)), messages, tools)


STRICT = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string", "maxLength": 8}},
                "required": ["expr"],
                "additionalProperties": False,
            },
        },
    }
]


def _same_call(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded output message as far as streaming cannot change it: its text ("" and null alike), its
    reasoning, and its tool calls with their arguments as JSON values (vLLM re-dumps the arguments of an
    unstreamed answer, and streams them as generated) and without their ids (drawn per request)."""
    return {
        "content": message.get("content") or None,
        "reasoning": message.get("reasoning_content") or message.get("reasoning") or None,
        "tool_calls": [
            (c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or ()
        ],
    }


def _recorded(sink: MemorySink) -> list[tuple[list[int], list[int], list[dict[str, Any]]]]:
    """(prompt ids, completion ids, output messages) of each span the gateway wrote."""
    out = []
    for rec in sink.records:
        for s in ExportTraceServiceRequest.FromString(rec.value).resource_spans[0].scope_spans[0].spans:
            attrs = {kv.key: kv.value for kv in s.attributes}
            out.append(
                (
                    [v.int_value for v in attrs[A.LLM_PROMPT_TOKEN_IDS].array_value.values],
                    [v.int_value for v in attrs[A.LLM_COMPLETION_TOKEN_IDS].array_value.values],
                    json.loads(attrs[A.GEN_AI_OUTPUT_MESSAGES].string_value),
                )
            )
    return out


def test_streamed_tool_calls_record_the_same_call_as_unstreamed(vllm_server: VllmServer) -> None:
    """Through the gateway: a streamed answer with a tool call records the ids and the message (tool call
    included) that the same request records without streaming. The 135M model calls no tool on "auto", so
    the calls are asked for ("required", and by name: vLLM's guided decoding writes them)."""
    retok = Retokenizer(str(vllm_server.model_path))
    ask = [{"role": "user", "content": "Use calc to compute 41*86."}]
    for choice in ("required", {"type": "function", "function": {"name": "calc"}}):
        body = {
            "model": vllm_server.served_name,
            "messages": ask,
            "tools": STRICT,
            "tool_choice": choice,
            "max_tokens": 96,
            "temperature": 0,
        }
        plain, plain_sink = asyncio.run(_through_gateway(vllm_server.url, body))
        streamed, stream_sink = asyncio.run(_through_gateway(vllm_server.url, {**body, "stream": True}))
        assert plain.status_code == 200 and streamed.status_code == 200, (plain.text, streamed.text)
        (recorded,) = _recorded(plain_sink)
        (streamed_call,) = _recorded(stream_sink)
        assert streamed_call[:2] == recorded[:2] and recorded[1]
        (message,) = recorded[2]
        assert message["tool_calls"] and message["tool_calls"][0]["function"]["name"] == "calc"
        assert [_same_call(m) for m in streamed_call[2]] == [_same_call(message)]
        assert retok.prompt_ids(json.dumps(ask), json.dumps(STRICT)) == recorded[0]
