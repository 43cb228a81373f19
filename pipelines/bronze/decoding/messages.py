"""Chat messages of an LLM span, as the conventions (`pipelines.bronze.conventions`) write them.

Messages come as one JSON attribute (``gen_ai.input.messages``), or flattened one attribute per
field (OpenInference ``llm.input_messages.{i}.message.role``, old GenAI ``gen_ai.prompt.{i}.role``);
either way the `spans` row holds a JSON list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pipelines.bronze import conventions
from pipelines.bronze.decoding.json_text import dumps

_FLAT = conventions.flat_messages()
FLAT_MESSAGE_PREFIXES = tuple(p for f in _FLAT for p in (f.input_prefix, f.output_prefix))


def messages_json(v: Any) -> str | None:
    """A messages attribute as JSON text: a string is kept as sent."""
    if v is None:
        return None
    return v if isinstance(v, str) else dumps(v)


def _indexed_messages(attrs: Mapping[str, Any], prefix: str, role: str, content: str) -> str | None:
    """Flattened `prefix{i}.{role|content}` attributes (OpenInference, old GenAI) to a JSON list."""
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


def flat_messages(attrs: Mapping[str, Any], direction: Literal["input", "output"]) -> str | None:
    """Flattened ``direction`` messages as a JSON list, in the first layout of the conventions that has them."""
    for layout in _FLAT:
        prefix = layout.input_prefix if direction == "input" else layout.output_prefix
        found = _indexed_messages(attrs, prefix, layout.role, layout.content)
        if found:
            return found
    return None
