"""The OpenAI Responses API (``POST /v1/responses``) in the lake's chat shape, as vLLM itself renders it.

A Responses request carries ``instructions`` and ``input`` items (messages, ``function_call``,
``function_call_output``, ``reasoning``), and function tools flat (``{"type": "function", "name": ...}``).
vLLM turns them into chat messages before applying the chat template (its ``construct_input_messages``):
instructions become the system turn, a function call joins the assistant turn before it as a tool call,
an assistant text fills a tool-calling turn that has no text yet, a function call output is a ``tool``
message. ``input_messages`` does the same, so the span's messages retokenize to the prompt vLLM served.

vLLM returns a call's exact prompt and completion token ids when asked for ``enable_response_messages``
(``input_messages`` / ``output_messages`` as ``raw_message_tokens``), streamed (in ``response.completed``) or
not; ``upstream_body`` asks for them, ``strip`` takes them out again where the client did not ask.
Every function here is total: a malformed item is skipped, never raised on (``problem`` names what
makes a body unservable, for a 400 before any upstream call).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from collectors.gateway.spans import LlmCall
from schemas.chat_messages import reply_message, tool_call

RAW_TOKENS = "raw_message_tokens"
_TEXT_PARTS = ("input_text", "output_text", "text")


def problem(body: Mapping[str, Any]) -> str | None:
    """Why a request body cannot be a Responses call (a 400 with this message), or None."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model must be a non-empty string"
    given = body.get("input")
    if not isinstance(given, str | list):
        return "input must be a string or a list of input items"
    if isinstance(given, list):
        for n, item in enumerate(given):
            if not isinstance(item, Mapping):
                return f"input[{n}] must be an object (a message or an item with a type)"
            if "role" not in item and not isinstance(item.get("type"), str):
                return f"input[{n}] has neither a role nor a type"
    if body.get("instructions") is not None and not isinstance(body.get("instructions"), str):
        return "instructions must be a string"
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, Mapping) for t in tools)):
        return "tools must be a list of objects"
    return None


def upstream_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request vLLM gets: the client's, asking for the raw prompt and output tokens."""
    return {**body, "enable_response_messages": True}


def strip(data: dict[str, Any], *, asked: bool) -> dict[str, Any]:
    """The answer less the token extras the client did not ask for (``enable_response_messages``)."""
    if not asked:
        data.pop("input_messages", None)
        data.pop("output_messages", None)
    return data


def text(content: Any) -> str | None:  # noqa: ANN401 - JSON
    """A message's content as the text the template sees: a string, or its text parts one per line."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def _first_text(content: Any) -> str | None:  # noqa: ANN401 - JSON
    """An output message's text: vLLM reads its first part only."""
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        value = content[0].get("text")
        return value if isinstance(value, str) else None
    return content if isinstance(content, str) else None


def _items(value: Any) -> list[Mapping[str, Any]]:  # noqa: ANN401 - JSON
    """The objects of a JSON list (anything else: none)."""
    return [i for i in value if isinstance(i, Mapping)] if isinstance(value, list) else []


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    return tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))


def input_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's instructions and input as chat messages, merged the way vLLM merges them."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    for item in given if isinstance(given, list) else ():
        if isinstance(item, Mapping):
            message = _message(item, messages[-1] if messages and messages[-1].get("role") == "assistant" else None)
            if message is not None:
                messages.append(message)
    return messages


def _message(item: Mapping[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """One item as a new chat message, or None when it joined ``prev`` (the assistant turn before it)."""
    kind = item.get("type")
    if kind == "function_call":
        call = _call(item)
        if prev is not None:
            prev.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        reasoning = _first_text(parts) or ""
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "tool", "content": text(output), "tool_call_id": item.get("call_id")}
    role = item.get("role")
    if role == "assistant":
        said = _first_text(item.get("content"))  # vLLM reads an assistant message's first part only
        if said is None:
            return {"role": "assistant", "content": text(item.get("content"))}
        if prev is not None and prev.get("content") is None:
            prev["content"] = said
            return None
        return {"role": "assistant", "content": said}
    if isinstance(role, str):
        return {"role": role, "content": text(item.get("content"))}
    return None


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:  # noqa: ANN401 - JSON
    """The request's function tools in chat form (``{"type": "function", "function": {...}}``)."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("type") == "function" and isinstance(tool.get("name"), str):
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
            out.append({"type": "function", "function": fn})
    return out or None


def output_message(data: Mapping[str, Any]) -> dict[str, Any]:
    """The answer's output items as one assistant message: its text, tool calls and reasoning."""
    said: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in _items(data.get("output")):
        if item.get("type") == "message":
            said.append(text(item.get("content")) or "")
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id"), "function": {k: item.get(k) for k in ("name", "arguments")}})
        elif item.get("type") == "reasoning":
            reasoning.append(text(item.get("content")) or "")
    message: dict[str, Any] = {"content": "".join(said) or None, "tool_calls": calls or None}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    return reply_message(message)


def token_ids(data: Mapping[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """(prompt ids, completion ids) vLLM reported (``enable_response_messages``), each None when absent."""

    def ids(key: str) -> list[int] | None:
        raw = data.get(key)
        if not isinstance(raw, list) or not raw:
            return None
        out: list[int] = []
        for m in raw:
            tokens = m.get("tokens") if isinstance(m, Mapping) and m.get("type") == RAW_TOKENS else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                return None  # harmony messages or another shape: no ids we can vouch for
            out.extend(tokens)
        return out

    prompt = ids("input_messages")
    return prompt, ids("output_messages") if prompt is not None else None


def finish_reason(data: Mapping[str, Any]) -> str | None:
    """The chat finish reason of the answer: length when cut short, tool_calls when it called, else stop."""
    status = data.get("status")
    if status == "incomplete":
        return "length"
    if status not in ("completed", None):
        return str(status)
    if any(i.get("type") == "function_call" for i in _items(data.get("output"))):
        return "tool_calls"
    return "stop"


def usage(data: Mapping[str, Any]) -> dict[str, Any]:
    """The answer's usage under the chat names the span reads."""
    raw = data.get("usage")
    if not isinstance(raw, Mapping):
        return {}
    return {"prompt_tokens": raw.get("input_tokens"), "completion_tokens": raw.get("output_tokens")}


def completed(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The whole answer a stream ends with (``response.completed`` / ``.incomplete`` / ``.failed``), or None."""
    if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
        response = event.get("response")
        return dict(response) if isinstance(response, Mapping) else None
    return None


def answered_call(data: Mapping[str, Any], base: LlmCall) -> LlmCall:
    """The recorded call once vLLM answered ``data`` (a whole Responses object)."""
    prompt, completion = token_ids(data)
    return replace(
        base,
        response_model=data.get("model") if isinstance(data.get("model"), str) else None,
        response_id=data.get("id") if isinstance(data.get("id"), str) else None,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        output_message=output_message(data),
        finish_reason=finish_reason(data),
        usage=usage(data),
    )
