"""The chat messages the lake stores as JSON text (``input_messages`` / ``output_messages``), read back.

Written by ingestion (``pipelines.bronze.decoding.messages``) in one internal shape whatever convention
recorded the span: OpenAI chat messages, with ``tool_calls`` / ``tool_call_id`` / ``reasoning_content``
where recorded (``pipelines.bronze.conventions.internal``); read by lake-side reward functions (the SDK's
``Trajectory``) and the LLM judge, which must read them the same way.
"""

from __future__ import annotations

import json
from typing import Any


def parse_messages(text: str | None) -> list[dict[str, Any]]:
    """The messages in ``text``: a JSON list of objects (one object counts as a list of one); text that
    is not JSON is one message of role "unknown", so nothing the agent said is lost to a reader."""
    if not text:
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [{"role": "unknown", "content": text}]
    if isinstance(value, dict):
        value = [value]
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []
