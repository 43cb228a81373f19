"""Each trace convention's adapter, against spans made by the real instrumentation library.

The OpenAI client is instrumented by OpenInference (``openinference-instrumentation-openai``),
OpenLLMetry (``opentelemetry-instrumentation-openai``, GenAI 1.37+ JSON parts) and the official GenAI
instrumentation (``opentelemetry-instrumentation-openai-v2``); the model is scripted (an in-process
responder, `conventions_fixtures`). Hypothesis generates histories (text, content parts, single and
parallel tool calls, tool results, several turns, missing ids, arguments that are not JSON); each span
goes through the real bronze decoding, and its messages and tools must equal the internal shape of
what the client sent and got back.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import string
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipelines.bronze.decoding import KafkaRecord, SpanBatch
from pipelines.silver.trajectories import assemble
from schemas.tables import SPANS
from tests.pipelines.conventions_fixtures import LIBRARIES, decode, expected, instrumented

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))

_text = st.text(alphabet=string.ascii_letters + string.digits + " .,é€", min_size=1, max_size=16).filter(
    lambda s: s.strip() == s and s != ""
)
_args_json = st.dictionaries(st.sampled_from("abcxyz"), st.integers(-5, 500) | _text, max_size=3).map(
    lambda d: json.dumps(d, ensure_ascii=False)
)
_args_broken = _text.map(lambda s: "not json: " + s)  # a malformed call the model made: still training data
_names = st.sampled_from(["add", "mul", "lookup"])


@st.composite
def _tool_calls(draw: st.DrawFn, prefix: str, missing_ids: bool) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 3))  # parallel calls
    calls = []
    for i in range(n):
        call: dict[str, Any] = {
            "type": "function",
            "function": {"name": draw(_names), "arguments": draw(_args_json | _args_broken)},
        }
        if not missing_ids or i == 0 or draw(st.booleans()):  # some calls come without an id
            call["id"] = f"{prefix}{i}"
        calls.append(call)
    return calls


@st.composite
def history(draw: st.DrawFn, content_parts: bool, missing_ids: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages the client sends, the scripted assistant reply)."""
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_text)})
    for turn in range(draw(st.integers(1, 3))):
        if content_parts and draw(st.booleans()):
            parts = draw(st.lists(_text, min_size=2, max_size=3))
            msgs.append({"role": "user", "content": [{"type": "text", "text": t} for t in parts]})
        else:
            msgs.append({"role": "user", "content": draw(_text)})
        if draw(st.booleans()):
            calls = draw(_tool_calls(f"call_{turn}_", missing_ids))
            msgs.append({"role": "assistant", "content": draw(st.none() | _text), "tool_calls": calls})
            for c in calls:
                result: dict[str, Any] = {"role": "tool", "content": draw(_text)}
                if "id" in c:
                    result["tool_call_id"] = c["id"]
                msgs.append(result)
        else:
            msgs.append({"role": "assistant", "content": draw(_text)})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": draw(_text)})
    if draw(st.booleans()):
        reply: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": draw(_tool_calls("call_out_", missing_ids)),
        }
    else:
        reply = {"role": "assistant", "content": draw(_text)}
    return msgs, reply


_tools = st.lists(
    st.builds(
        lambda name, desc: {
            "type": "function",
            "function": {
                "name": name,
                "description": desc,
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            },
        },
        st.sampled_from(["add", "mul", "lookup"]),
        _text,
    ),
    max_size=2,
    unique_by=lambda t: t["function"]["name"],
)


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_a_real_library_span_decodes_to_the_history_the_client_sent(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    library = LIBRARIES[name]
    with instrumented(library, monkeypatch) as client:

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        @given(history(library.content_parts, library.missing_ids), _tools)
        def check(sent: tuple[list[dict[str, Any]], dict[str, Any]], tools: list[dict[str, Any]]) -> None:
            messages, reply = sent
            row = decode(client.call(messages, tools, reply))
            assert json.loads(row["input_messages"]) == expected(messages, library)
            assert json.loads(row["output_messages"]) == expected([reply], library)
            want_tools = tools if (tools and library.tools) else None
            assert (json.loads(row["tools"]) if row["tools"] else None) == want_tools

        check()


def test_the_openinference_history_keeps_its_tool_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: a tool call and its result ("408") decode with tool_calls, tool_call_id and tools."""
    tool = {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}
    sent = [
        {"role": "user", "content": "what is 17 * 24?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "mul", "arguments": '{"a":17,"b":24}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
    ]
    with instrumented(LIBRARIES["openinference"], monkeypatch) as client:
        row = decode(client.call(sent, [tool], {"role": "assistant", "content": "408"}))
    got = json.loads(row["input_messages"])
    assert got[1] == {"role": "assistant", "content": None, "tool_calls": sent[1]["tool_calls"]}
    assert got[2] == {"role": "tool", "tool_call_id": "c1", "content": "408"}
    assert json.loads(row["tools"]) == [tool]
    # silver carries the tools into the call, where gold reads them (`trajectories.calls[].tools`)
    spans = pl.DataFrame([row], schema=pl.DataFrame(SPANS.empty_table()).schema)
    (traj,) = assemble(spans, now=dt.datetime.now(dt.UTC), idle_timeout_s=60).to_pylist()
    (call,) = traj["calls"]
    assert json.loads(call["tools"]) == [tool] and call["input_messages"] == row["input_messages"]


def test_openllmetry_reasoning_becomes_reasoning_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply's ``reasoning_content`` (vLLM's reasoning parser) is a GenAI ``reasoning`` part, read back."""
    reply = {"role": "assistant", "content": "408", "reasoning_content": "17 * 24 = 408"}
    with instrumented(LIBRARIES["openllmetry"], monkeypatch) as client:
        row = decode(client.call([{"role": "user", "content": "17 * 24?"}], [], reply))
    assert json.loads(row["output_messages"]) == [reply]


def _flat_span(attrs: dict[str, Any]) -> ReadableSpan:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("openllmetry-0.4x").start_as_current_span("openai.chat") as span:
        span.set_attributes(attrs)
    (done,) = exporter.get_finished_spans()
    return done


def test_the_pre_1_37_flattened_layout_with_openllmetrys_tool_calls() -> None:
    """Older OpenLLMetry (before it wrote ``gen_ai.input.messages``) flattened messages one attribute per
    field, tool calls and request functions included. That release cannot be installed beside the current
    one, so this span is built with the attribute names it wrote (its ``_set_prompts`` /
    ``_set_completions`` / ``_set_functions_attributes``)."""
    span = _flat_span(
        {
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": '[{"type": "text", "text": "17 * 24?"}, {"type": "text", "text": "quick"}]',
            "gen_ai.prompt.1.role": "assistant",
            "gen_ai.prompt.1.tool_calls.0.id": "c1",
            "gen_ai.prompt.1.tool_calls.0.name": "mul",
            "gen_ai.prompt.1.tool_calls.0.arguments": '{"a": 17, "b": 24}',
            "gen_ai.prompt.1.tool_calls.1.name": "add",  # no id: stored, not rejected
            "gen_ai.prompt.1.tool_calls.1.arguments": "{not json",
            "gen_ai.prompt.2.role": "tool",
            "gen_ai.prompt.2.tool_call_id": "c1",
            "gen_ai.prompt.2.content": "408",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.finish_reason": "tool_calls",
            "gen_ai.completion.0.tool_calls.0.id": "c2",
            "gen_ai.completion.0.tool_calls.0.name": "add",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"a": 408}',
            "llm.request.functions.0.name": "mul",
            "llm.request.functions.0.description": "a*b",
            "llm.request.functions.0.parameters": '{"type": "object"}',
        }
    )
    row = decode(span)
    assert json.loads(row["input_messages"]) == [
        {"role": "user", "content": "17 * 24?\nquick"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "mul", "arguments": '{"a": 17, "b": 24}'}},
                {"id": None, "type": "function", "function": {"name": "add", "arguments": "{not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
    ]
    assert json.loads(row["output_messages"]) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 408}'}}],
        }
    ]
    assert json.loads(row["tools"]) == [
        {"type": "function", "function": {"name": "mul", "description": "a*b", "parameters": {"type": "object"}}}
    ]


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"gen_ai.input.messages": "[{not json"}, "gen_ai.input.messages is not JSON"),
        ({"gen_ai.output.messages": '{"role": "assistant"}'}, "gen_ai.output.messages is not a JSON list of objects"),
        ({"gen_ai.input.messages": '["hi"]'}, "gen_ai.input.messages is not a JSON list of objects"),
        ({"gen_ai.tool.definitions": "nope"}, "gen_ai.tool.definitions is not JSON"),
        ({"llm.tools.0.tool.json_schema": "{"}, "llm.tools.0.tool.json_schema is not JSON"),
    ],
)
def test_a_span_whose_messages_cannot_be_read_is_quarantined_with_the_reason(
    attrs: dict[str, Any], reason: str
) -> None:
    """The record is kept whole in quarantine, its error naming the span and the attribute; a good record
    of the same batch decodes."""
    good = _flat_span({"gen_ai.input.messages": '[{"role": "user", "content": "hi"}]'})
    bad = _flat_span(attrs)
    batch = SpanBatch()
    for i, s in enumerate((good, bad)):
        batch.add(KafkaRecord("agentlake.spans.v1", 0, i, None, encode_spans([s]).SerializeToString(), []))
    (row,) = batch.to_table().to_pylist()
    assert json.loads(row["input_messages"]) == [{"role": "user", "content": "hi"}]
    (q,) = batch.quarantine
    assert q["kafka_offset"] == 1 and q["value"] == encode_spans([bad]).SerializeToString()
    assert q["error"].startswith("MalformedMessages: span 'openai.chat': ") and reason in q["error"]
