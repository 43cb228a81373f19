"""The lake's shape of one model reply, built the same way by every recorder (the SDK, the gateway).

A reply is one OpenAI chat-format assistant message: ``content`` (its text; null when the turn only calls
tools, "" when it said nothing),
``tool_calls`` (``arguments`` as the JSON text the model wrote, valid or not) and ``reasoning_content``,
the last two only where the reply has them. A streamed reply is rebuilt from its deltas, so a streamed
call is recorded as the same call without streaming.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def as_json_text(v: Any) -> str:
    """``v`` as text: a string as recorded, anything else as its JSON (non-ASCII kept)."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """One tool call in the lake's shape, for recorders and decoders alike (a missing id stays null:
    stored, not rejected; arguments that are not text are written as their JSON)."""
    return {
        "id": None if call_id is None else str(call_id),
        "type": "function",
        "function": {
            "name": "" if name is None else str(name),
            "arguments": as_json_text(arguments) if arguments is not None else "",
        },
    }


def _reply_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    fn: Mapping[str, Any] = function if isinstance(function, Mapping) else {}
    return tool_call(call.get("id"), fn.get("name"), fn.get("arguments"))


def reply_message(message: Mapping[str, Any] | None, *, text: str | None = None) -> dict[str, Any]:
    """The assistant ``message`` of a chat reply in the lake's shape; ``text`` is a completion's text instead."""
    if message is None:
        return {"role": "assistant", "content": text}
    calls = message.get("tool_calls")
    calls = [_reply_tool_call(c) for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []
    content = message.get("content")
    out: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    return out


class StreamedReply:
    """A chat reply rebuilt from streamed deltas: text and reasoning in pieces, each tool call's id and name
    once and its arguments in fragments, keyed by the call's ``index``."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: Mapping[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        piece = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(piece, str):
            self.reasoning.append(piece)
        for part in delta.get("tool_calls") or ():
            if not isinstance(part, Mapping):
                continue
            call = self.calls.setdefault(int(part.get("index") or 0), {"id": None, "name": None, "arguments": []})
            function = part.get("function") if isinstance(part.get("function"), Mapping) else {}
            assert isinstance(function, Mapping)
            for key, value in (("id", part.get("id")), ("name", function.get("name"))):
                if isinstance(value, str) and value and call[key] is None:
                    call[key] = value
            if isinstance(function.get("arguments"), str):
                call["arguments"].append(function["arguments"])

    def message(self) -> dict[str, Any]:
        """The reply as ``reply_message`` gives it for the same answer without streaming."""
        text = "".join(self.text)
        calls = [
            {"id": c["id"], "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
            for _, c in sorted(self.calls.items())
        ]
        message: dict[str, Any] = {"content": text if text or not calls else None, "tool_calls": calls}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return reply_message(message)
