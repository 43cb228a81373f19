"""Exact retokenization over generated histories, against the shipped model's tokenizer and template.

The response is what the model generated: its reasoning as ``<think>`` text, its content, its tool calls in
the hermes parser's format, up to and including ``<|im_end|>`` and not the newline the template writes
after it; the prompt and the response, with that newline, tokenize as the whole history does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.gold.retokenize import Retokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
]
# hermes: <tool_call>{json}</tool_call>, parsed with json.loads and re-dumped (vllm/tool_parsers/hermes_tool_parser.py)
HERMES = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

words = st.text(alphabet=st.sampled_from("abcdefgh xyz0123456789.,?!é\n"), min_size=1, max_size=24)
args = st.dictionaries(st.sampled_from(["expr", "q", "n"]), st.one_of(words, st.integers(-99, 999)), max_size=2)


@st.composite
def tool_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 3))  # single and parallel calls
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": draw(st.sampled_from(["calc", "search"])), "arguments": json.dumps(draw(args))},
        }
        for i in range(n)
    ]


@st.composite
def assistant(draw: st.DrawFn, *, reasoning: bool = True) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), words))}
    if draw(st.booleans()):
        msg["tool_calls"] = draw(tool_calls())
    if msg["content"] is None and "tool_calls" not in msg:
        msg["content"] = draw(words)
    if reasoning and draw(st.booleans()):
        msg["reasoning_content"] = draw(words)
    return msg


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]] | None]:
    """(prompt messages, the model's reply, tools): several turns, tool results after tool calls."""
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(words)})
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(words)})
        for _ in range(draw(st.integers(0, 2))):
            turn = draw(assistant(reasoning=False))  # earlier turns as the agent sends them back
            msgs.append(turn)
            for call in turn.get("tool_calls", []):
                msgs.append({"role": "tool", "tool_call_id": call["id"], "content": draw(words)})
            if "tool_calls" not in turn:
                break
        if msgs[-1]["role"] == "assistant":
            msgs.append({"role": "user", "content": draw(words)})
    tools = draw(st.one_of(st.none(), st.just(TOOLS)))
    return msgs, draw(assistant()), tools


def as_vllm(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to the template: tool-call arguments parsed to objects."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def raw_text(reply: dict[str, Any]) -> str:
    """The text a model following the template generates for ``reply``, written out independently."""
    text = f"<think>{reply['reasoning_content']}</think>" if reply.get("reasoning_content") else ""
    text += reply.get("content") or ""
    calls = [
        '<tool_call>\n{"name": ' + json.dumps(c["function"]["name"]) + ', "arguments": '
        f"{json.dumps(json.loads(c['function']['arguments']), ensure_ascii=False)}}}\n</tool_call>"
        for c in reply.get("tool_calls", [])
    ]
    return text + "\n".join(calls) + "<|im_end|>"


@pytest.fixture(scope="module")
def retok(smollm2_dir: Path) -> Retokenizer:
    return Retokenizer(str(smollm2_dir))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories())
def test_generated_histories_retokenize_exactly(retok: Retokenizer, history: Any) -> None:  # noqa: ANN401
    prompt_msgs, reply, tools = history
    enc = retok.encode(json.dumps(prompt_msgs), json.dumps([reply]), json.dumps(tools) if tools else None)
    assert enc is not None
    prompt, response = enc
    tok = retok.tokenizer
    # the prompt is the template's rendering with tools and the generation prompt, as vLLM renders it
    expected = tok.apply_chat_template(as_vllm(prompt_msgs), tools=tools, add_generation_prompt=True, tokenize=False)
    assert prompt == tok(expected, add_special_tokens=False)["input_ids"]
    # the response ends at the end-of-turn token the model generates, and says what the model wrote
    assert response[-1] == tok.convert_tokens_to_ids("<|im_end|>") and response.count(response[-1]) == 1
    assert tok.decode(response) == raw_text(reply)
    # prompt + response + the template's newline between turns is the whole history, token for token:
    # what the next call's prompt continues. Not always for a reply that starts with whitespace: BPE may merge
    # the generation prompt's "\n" with it ("\n " can be one token), and then the re-rendered history tokenizes
    # otherwise than the turn was generated, and the next call does not merge with this one (a merge break).
    generated = {**reply, "content": raw_text(reply).removesuffix("<|im_end|>").split("<tool_call>")[0]}
    generated.pop("reasoning_content", None)
    full = tok.apply_chat_template(as_vllm([*prompt_msgs, generated]), tools=tools, tokenize=False)
    whole = prompt + response + tok("\n", add_special_tokens=False)["input_ids"]
    if not raw_text(reply)[:1].isspace():
        assert whole == tok(full, add_special_tokens=False)["input_ids"]
    # the hermes parser reads the tool calls back from the response text
    parsed = [json.loads(a or b) for a, b in HERMES.findall(tok.decode(response))]
    assert [(p["name"], p["arguments"]) for p in parsed] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.get("tool_calls", [])
    ]


def test_legacy_rows_and_content_parts(retok: Retokenizer) -> None:
    """{role, content} rows and OpenAI content parts (joined with newlines, as vLLM does) still tokenize."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    plain = [{"role": "user", "content": "a\nb"}]
    reply = '[{"role": "assistant", "content": "ok"}]'
    assert retok.encode(json.dumps(parts), reply) == retok.encode(json.dumps(plain), reply)
    enc = retok.encode(json.dumps(plain), reply)
    assert enc is not None and retok.tokenizer.decode(enc[1]) == "ok<|im_end|>"
    assert retok.encode("[]", reply) is None and retok.encode(json.dumps(plain), None) is None
