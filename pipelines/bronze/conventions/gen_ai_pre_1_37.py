"""GenAI before 1.37, as OpenLLMetry (traceloop) wrote it: messages flattened one attribute per field.

``gen_ai.prompt.{i}.{role,content,tool_call_id}``, ``gen_ai.prompt.{i}.tool_calls.{j}.{id,name,arguments}``
(and the same under ``gen_ai.completion.``), the request's tools as
``llm.request.functions.{i}.{name,description,parameters}``. Content that was a list of parts is
recorded as its JSON text. A convention of its own because it ranks after OpenInference.
"""

from __future__ import annotations

import json
from typing import Any

from pipelines.bronze.conventions.base import Attributes, Convention, Direction, MessageReader
from pipelines.bronze.conventions.internal import Message, Tool, indexed, message, openai_tool, sub_indexed, tool_call
from schemas import attributes as A


def _content(v: Any) -> str | None:
    """Content as recorded; a JSON list of text parts (how list content was written) joined to text."""
    if isinstance(v, str) and v.startswith("[{"):
        try:
            parts = json.loads(v)
        except ValueError:
            return v
        if isinstance(parts, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
            return "\n".join(str(p.get("text", "")) for p in parts)
    return None if v is None else str(v)


def read_messages(attrs: Attributes, direction: Direction) -> list[Message] | None:
    prefix = A.GEN_AI_PROMPT_PREFIX_OLD if direction == "input" else A.GEN_AI_COMPLETION_PREFIX_OLD
    found = indexed(attrs, prefix)
    if not found:
        return None
    out = []
    for _, f in sorted(found.items()):
        calls = [tool_call(c.get("id"), c.get("name"), c.get("arguments")) for c in sub_indexed(f, A.OLD_TOOL_CALLS)]
        out.append(
            message(f.get("role"), _content(f.get("content")), tool_calls=calls, tool_call_id=f.get(A.OLD_TOOL_CALL_ID))
        )
    return out


def read_tools(attrs: Attributes) -> list[Tool] | None:
    found = indexed(attrs, A.LLM_REQUEST_FUNCTIONS_PREFIX)
    if not found:
        return None
    return [t for _, f in sorted(found.items()) if (t := openai_tool(f)) is not None]


GEN_AI_PRE_1_37 = Convention(
    name="gen_ai (pre-1.37)",
    messages=MessageReader(
        read_messages,
        read_tools,
        prefixes=(A.GEN_AI_PROMPT_PREFIX_OLD, A.GEN_AI_COMPLETION_PREFIX_OLD, A.LLM_REQUEST_FUNCTIONS_PREFIX),
    ),
)
