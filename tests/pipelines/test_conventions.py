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

import json
import os
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_the_openinference_history_keeps_its_tool_parts() -> None:
    """The issue's case: a tool call and its result ("408") decode with tool_calls, tool_call_id and tools."""
    pytest.importorskip("openinference.instrumentation.openai")
    monkeypatch = pytest.MonkeyPatch()
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
    monkeypatch.undo()
    got = json.loads(row["input_messages"])
    assert got[1] == {"role": "assistant", "content": None, "tool_calls": sent[1]["tool_calls"]}
    assert got[2] == {"role": "tool", "tool_call_id": "c1", "content": "408"}
    assert json.loads(row["tools"]) == [tool]
