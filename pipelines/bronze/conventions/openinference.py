"""OpenInference (``llm.*``, Arize/Phoenix instrumentations): flattened messages and tools, and the
response id its OpenAI instrumentation keeps only inside the raw response (``output.value``).

Messages: ``llm.{input,output}_messages.{i}.message.{role,content,tool_call_id,name}``, content parts as
``message.contents.{j}.message_content.{type,text}``, tool calls as
``message.tool_calls.{j}.tool_call.{id,function.name,function.arguments}``; tools as
``llm.tools.{i}.tool.json_schema`` (the OpenAI tool object as JSON text).
"""

from __future__ import annotations

import json

from pipelines.bronze.conventions.base import Attributes, Convention, Direction, MessageReader, ResponseIdReader
from pipelines.bronze.conventions.internal import (
    Message,
    Tool,
    indexed,
    load_json,
    message,
    openai_tool,
    sub_indexed,
    tool_call,
)
from schemas import attributes as A


def response_id(attrs: Attributes) -> str | None:
    """The ``id`` of the raw OpenAI response an OpenInference LLM span keeps in ``output.value``.

    It is what joins the client's record of a call to the gateway's (exact tokens) when the client
    forwards no trace context.
    """
    if attrs[A.OI_SPAN_KIND] != A.OI_SPAN_KIND_LLM:
        return None
    raw = attrs[A.OI_OUTPUT_VALUE]
    if not isinstance(raw, str) or not raw.startswith("{") or '"id"' not in raw:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes: no id
        return None
    rid = value.get("id") if isinstance(value, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _is_model_call(attrs: Attributes) -> bool:
    """Only an ``LLM`` span is a model call. LangChain's instrumentation also writes a graph node's input
    messages on its ``CHAIN`` spans; read as calls, every LangGraph step would count as one more call."""
    return attrs.get(A.OI_SPAN_KIND, A.OI_SPAN_KIND_LLM) == A.OI_SPAN_KIND_LLM


def read_messages(attrs: Attributes, direction: Direction) -> list[Message] | None:
    if not _is_model_call(attrs):
        return None
    prefix = A.OI_LLM_INPUT_MESSAGES_PREFIX if direction == "input" else A.OI_LLM_OUTPUT_MESSAGES_PREFIX
    found = indexed(attrs, prefix)
    if not found:
        return None
    out = []
    for _, f in sorted(found.items()):
        content = f.get(A.OI_MESSAGE_CONTENT_SUFFIX)
        if content is None:
            texts = [
                c["message_content.text"] for c in sub_indexed(f, A.OI_MESSAGE_CONTENTS) if "message_content.text" in c
            ]
            content = "\n".join(str(t) for t in texts) if texts else None
        calls = [
            tool_call(c.get("tool_call.id"), c.get("tool_call.function.name"), c.get("tool_call.function.arguments"))
            for c in sub_indexed(f, A.OI_MESSAGE_TOOL_CALLS)
        ]
        out.append(
            message(
                f.get(A.OI_MESSAGE_ROLE_SUFFIX),
                None if content is None else str(content),
                tool_calls=calls,
                tool_call_id=f.get(A.OI_MESSAGE_TOOL_CALL_ID),
                name=f.get(A.OI_MESSAGE_NAME),
            )
        )
    return out


def read_tools(attrs: Attributes) -> list[Tool] | None:
    if not _is_model_call(attrs):
        return None
    found = indexed(attrs, A.OI_LLM_TOOLS_PREFIX)
    if not found:
        return None
    tools = []
    for i, f in sorted(found.items()):
        if A.OI_TOOL_JSON_SCHEMA in f:
            key = f"{A.OI_LLM_TOOLS_PREFIX}{i}.{A.OI_TOOL_JSON_SCHEMA}"
            if (t := openai_tool(load_json(key, f[A.OI_TOOL_JSON_SCHEMA]))) is not None:
                tools.append(t)
    return tools


OPENINFERENCE = Convention(
    name="openinference",
    agent_name=(A.OI_AGENT_NAME,),
    model=(A.OI_LLM_MODEL_NAME,),
    messages=MessageReader(
        read_messages,
        read_tools,
        prefixes=(A.OI_LLM_INPUT_MESSAGES_PREFIX, A.OI_LLM_OUTPUT_MESSAGES_PREFIX, A.OI_LLM_TOOLS_PREFIX),
    ),
    response_id_reader=ResponseIdReader((A.OI_OUTPUT_VALUE, A.OI_SPAN_KIND), response_id),
)
