"""The internal message shape every convention maps to: OpenAI chat messages with tool calls.

A `spans` row holds ``input_messages`` / ``output_messages`` as a JSON list of these, and ``tools`` as
a JSON list of OpenAI tool definitions, whatever convention recorded the span, so that silver and gold
read one shape. The contract (keys absent where the convention records nothing):

- ``{"role": str, "content": str | None}``: content parts are joined to text ("\\n", as vLLM's chat
  parser joins them); null where a turn has no text (an assistant turn with only tool calls);
- assistant turns may carry ``"tool_calls": [{"id": str | None, "type": "function", "function":
  {"name": str, "arguments": str}}]``: ``arguments`` is always text (an object is written with
  ``json.dumps(obj, ensure_ascii=False)``; text that is not JSON is kept as is: it stays training data),
  and ``"reasoning_content": str``;
- tool results: ``{"role": "tool", "tool_call_id": str | None, "content": str}`` (+ ``"name"``).

The helpers here build that shape; `MalformedMessages` is what a reader raises when a message
attribute is there but holds no messages (decoding quarantines the record with that reason).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# one definition of a tool call's shape, shared with the recorders (the SDK, the gateway)
from schemas.chat_messages import as_json_text as as_json_text
from schemas.chat_messages import tool_call as tool_call

Message = dict[str, Any]
Tool = dict[str, Any]


class MalformedMessages(ValueError):
    """A message or tool attribute that cannot be read as messages; its text names the attribute."""


def text_of(content: Any) -> str | None:
    """Message content as text: a string as is, a list of content parts joined ("\\n"), else None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [t for p in content if (t := _part_text(p)) is not None]
        return "\n".join(texts) if texts else None
    return as_json_text(content)


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        for key in ("text", "content"):
            if isinstance(part.get(key), str):
                return str(part[key])
    return None


def message(
    role: Any,
    content: str | None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: Any = None,
    name: Any = None,
    reasoning: str | None = None,
) -> Message:
    """One message; tool-related keys only where given."""
    m: Message = {"role": "unknown" if role is None else str(role), "content": content}
    if tool_calls:
        m["tool_calls"] = tool_calls
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if m["role"] == "tool" or tool_call_id is not None:
        m["tool_call_id"] = None if tool_call_id is None else str(tool_call_id)
        if m["content"] is None:
            m["content"] = ""
    if name is not None:
        m["name"] = str(name)
    return m


def openai_message(m: Mapping[str, Any]) -> Message:
    """An OpenAI chat-format message (what a client sends, what the gateway records) in the internal shape."""
    calls = []
    for c in m.get("tool_calls") or ():
        if isinstance(c, Mapping):
            f = c.get("function")
            fn: Mapping[str, Any] = f if isinstance(f, Mapping) else {}
            calls.append(tool_call(c.get("id"), fn.get("name"), fn.get("arguments")))
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    return message(
        m.get("role"),
        text_of(m.get("content")),
        tool_calls=calls,
        tool_call_id=m.get("tool_call_id"),
        name=m.get("name"),
        reasoning=reasoning if isinstance(reasoning, str) else None,
    )


def openai_tool(t: Any) -> Tool | None:
    """A tool definition, nested (OpenAI: ``{"type", "function": {...}}``) or flat (GenAI: ``{"name", ...}``)."""
    if not isinstance(t, Mapping):
        return None
    nested = t.get("function")
    fn: Mapping[str, Any] = nested if isinstance(nested, Mapping) else t
    if not isinstance(fn.get("name"), str):
        return None
    out: dict[str, Any] = {"name": fn["name"]}
    if fn.get("description") is not None:
        out["description"] = fn["description"]
    params = fn.get("parameters")
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            pass
    if params is not None:
        out["parameters"] = params
    return {"type": "function", "function": out}


def load_json(attr: str, v: Any) -> Any:
    """An attribute's JSON value (a non-string value is taken as already parsed); raises `MalformedMessages`."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except (ValueError, RecursionError) as exc:
        raise MalformedMessages(f"{attr} is not JSON: {exc}") from None


def list_of_objects(attr: str, v: Any) -> list[Mapping[str, Any]]:
    """``v`` (parsed) as a list of objects, else `MalformedMessages` naming ``attr``."""
    if not isinstance(v, list) or not all(isinstance(m, Mapping) for m in v):
        raise MalformedMessages(f"{attr} is not a JSON list of objects (got {type(v).__name__})")
    return v


def indexed(attrs: Mapping[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """Flattened ``{prefix}{i}.{field}`` attributes as ``{i: {field: value}}`` (fields keep their dots)."""
    found: dict[int, dict[str, Any]] = {}
    n = len(prefix)
    for key, value in attrs.items():
        if key.startswith(prefix):
            idx, _, field = key[n:].partition(".")
            if idx.isdigit() and field:
                found.setdefault(int(idx), {})[field] = value
    return found


def sub_indexed(fields: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """The ``{prefix}{j}.{field}`` entries of one flattened item, in index order."""
    return [v for _, v in sorted(indexed(fields, prefix).items())]
