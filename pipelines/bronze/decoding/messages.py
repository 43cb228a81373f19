"""Chat messages of an LLM span, and the response id OpenInference hides in the raw response.

Messages come as one JSON attribute (``gen_ai.input.messages``), or flattened one attribute per
field (OpenInference ``llm.input_messages.{i}.message.role``, old GenAI ``gen_ai.prompt.{i}.role``);
either way the `spans` row holds a JSON list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pipelines.bronze.decoding.json_text import dumps
from schemas import attributes as A

FLAT_MESSAGE_PREFIXES = (
    A.OI_LLM_INPUT_MESSAGES_PREFIX,
    A.OI_LLM_OUTPUT_MESSAGES_PREFIX,
    A.GEN_AI_PROMPT_PREFIX_OLD,
    A.GEN_AI_COMPLETION_PREFIX_OLD,
)


def messages_json(v: Any) -> str | None:
    """A messages attribute as JSON text: a string is kept as sent."""
    if v is None:
        return None
    return v if isinstance(v, str) else dumps(v)


def _indexed_messages(attrs: Mapping[str, Any], prefix: str, role: str, content: str) -> str | None:
    """Flattened `prefix{i}.{role|content}` attributes (old GenAI, OpenInference) to a JSON list."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        idx, _, field = key[len(prefix) :].partition(".")
        if not idx.isdigit():
            continue
        if field == role:
            found.setdefault(int(idx), {})["role"] = value
        elif field == content:
            found.setdefault(int(idx), {})["content"] = value
    if not found:
        return None
    return json.dumps([found[i] for i in sorted(found)])


def flat_messages(attrs: Mapping[str, Any], openinference_prefix: str, old_genai_prefix: str) -> str | None:
    """Messages flattened the OpenInference way, else the old GenAI way, as a JSON list."""
    return _indexed_messages(
        attrs, openinference_prefix, A.OI_MESSAGE_ROLE_SUFFIX, A.OI_MESSAGE_CONTENT_SUFFIX
    ) or _indexed_messages(attrs, old_genai_prefix, "role", "content")


def oi_response_id(attrs: Mapping[str, Any]) -> str | None:
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
