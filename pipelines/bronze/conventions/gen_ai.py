"""OpenTelemetry GenAI semantic conventions 1.37+ (``gen_ai.*``): ids, model, and messages as JSON.

``gen_ai.input.messages`` / ``gen_ai.output.messages`` hold a JSON list of ``{"role", "parts": [...]}``
with ``text``, ``tool_call`` (``id``, ``name``, ``arguments``: an object), ``tool_call_response``
(``id``, ``response``) and ``reasoning`` parts; ``gen_ai.tool.definitions`` the request's tools. Written
by OpenLLMetry (0.4x+ and later) and ``opentelemetry-instrumentation-openai-v2``; the agentlake gateway
writes the same keys with OpenAI chat messages (no ``parts``), read as they are. The pre-1.37 flattened
layout is `gen_ai_pre_1_37`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipelines.bronze.conventions.base import Attributes, Convention, Direction, MessageReader
from pipelines.bronze.conventions.internal import (
    Message,
    Tool,
    as_json_text,
    list_of_objects,
    load_json,
    message,
    openai_message,
    openai_tool,
    text_of,
    tool_call,
)
from schemas import attributes as A


def _from_parts(m: Mapping[str, Any]) -> list[Message]:
    """One GenAI message to internal messages: each ``tool_call_response`` part is a tool message."""
    role = m.get("role")
    texts: list[str] = []
    reasoning: list[str] = []
    calls = []
    results: list[Message] = []
    for p in m.get("parts") or ():
        if not isinstance(p, Mapping):
            continue
        kind = p.get("type")
        if kind == "tool_call":
            calls.append(tool_call(p.get("id"), p.get("name"), p.get("arguments")))
        elif kind == "tool_call_response":
            # "response" in the conventions; "result" where PydanticAI writes it
            response = p.get("response", p.get("result"))
            text = text_of(response)
            if text is None and response is not None:
                text = as_json_text(response)
            results.append(message("tool", text or "", tool_call_id=p.get("id"), name=p.get("name")))
        elif kind == "reasoning":
            if (t := text_of(p.get("content"))) is not None:
                reasoning.append(t)
        elif (t := text_of(p.get("content"))) is not None:  # text, and any other part that carries text
            texts.append(t)
    if results and not texts and not calls and not reasoning:  # the results' carrier (role tool, or user)
        return results
    own = message(
        role,
        "\n".join(texts) if texts else None,
        tool_calls=calls,
        name=m.get("name"),
        reasoning="\n".join(reasoning) if reasoning else None,
    )
    return [own, *results]


def read_messages(attrs: Attributes, direction: Direction) -> list[Message] | None:
    key = A.GEN_AI_INPUT_MESSAGES if direction == "input" else A.GEN_AI_OUTPUT_MESSAGES
    raw = attrs.get(key)
    if raw is None:
        return None
    out: list[Message] = []
    for m in list_of_objects(key, load_json(key, raw)):
        out.extend(_from_parts(m) if "parts" in m else [openai_message(m)])
    return out


def read_tools(attrs: Attributes) -> list[Tool] | None:
    raw = attrs.get(A.GEN_AI_TOOL_DEFINITIONS)
    if raw is None:
        return None
    tools = list_of_objects(A.GEN_AI_TOOL_DEFINITIONS, load_json(A.GEN_AI_TOOL_DEFINITIONS, raw))
    return [t for d in tools if (t := openai_tool(d)) is not None]


GEN_AI = Convention(
    name="gen_ai",
    agent_name=(A.GEN_AI_AGENT_NAME,),
    response_id=(A.GEN_AI_RESPONSE_ID,),
    model=(A.GEN_AI_RESPONSE_MODEL, A.GEN_AI_REQUEST_MODEL),
    messages=MessageReader(
        read_messages,
        read_tools,
        keys=(A.GEN_AI_INPUT_MESSAGES, A.GEN_AI_OUTPUT_MESSAGES, A.GEN_AI_TOOL_DEFINITIONS),
    ),
)
