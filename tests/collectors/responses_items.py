"""Hypothesis strategies for Responses API requests: the item lists an Agents SDK history is made of
(user and assistant messages, function calls and their outputs, several turns), shared by the unit tests
and the test against real vLLM."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

TOOL = {
    "type": "function",
    "name": "calculate",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    "strict": True,
}

words = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "Zs"), exclude_characters="<>"), min_size=1, max_size=12
)


@st.composite
def user_item(draw: st.DrawFn) -> dict[str, Any]:
    said = draw(words)
    if draw(st.booleans()):
        return {"role": "user", "content": said}
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": said}]}


@st.composite
def assistant_item(draw: st.DrawFn) -> dict[str, Any]:
    said = draw(words)
    if draw(st.booleans()):
        return {"role": "assistant", "content": said}
    n = draw(st.integers(0, 999))
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": said, "annotations": []}],
    }


@st.composite
def tool_round(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One or two (parallel) function calls, then their outputs; maybe text before the calls."""
    items: list[dict[str, Any]] = []
    if draw(st.booleans()):
        items.append(draw(assistant_item()))
    calls = draw(st.integers(1, 2))
    for k in range(calls):
        a, b = draw(st.integers(0, 99)), draw(st.integers(0, 99))
        items.append(
            {
                "type": "function_call",
                "call_id": f"call_{k}_{a}",
                "name": "calculate",
                "arguments": json.dumps({"expression": f"{a} * {b}"}),
            }
        )
    for k in range(calls):
        items.append({"type": "function_call_output", "call_id": items[-calls]["call_id"], "output": str(k * 7)})
    return items


@st.composite
def responses_input(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A history: user turns, each answered by tool rounds and/or a text reply; ends with a user turn
    or a tool output (where the model speaks next)."""
    items: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        items.append(draw(user_item()))
        for _ in range(draw(st.integers(0, 2))):
            items += draw(tool_round())
        if draw(st.booleans()):
            items.append(draw(assistant_item()))
    if items[-1].get("role") == "assistant":
        items.append(draw(user_item()))
    return items


@st.composite
def responses_request(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"input": draw(responses_input())}
    if draw(st.booleans()):
        body["instructions"] = draw(words)
    if draw(st.booleans()):
        body["tools"] = [TOOL]
    return body
