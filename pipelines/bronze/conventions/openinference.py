"""OpenInference (``llm.*``, Arize/Phoenix instrumentations): flattened messages, and the response id
its OpenAI instrumentation keeps only inside the raw response (``output.value``)."""

from __future__ import annotations

import json

from pipelines.bronze.conventions.base import Attributes, Convention, FlatMessages, ResponseIdReader
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


OPENINFERENCE = Convention(
    name="openinference",
    agent_name=(A.OI_AGENT_NAME,),
    model=(A.OI_LLM_MODEL_NAME,),
    flat_messages=FlatMessages(
        A.OI_LLM_INPUT_MESSAGES_PREFIX,
        A.OI_LLM_OUTPUT_MESSAGES_PREFIX,
        A.OI_MESSAGE_ROLE_SUFFIX,
        A.OI_MESSAGE_CONTENT_SUFFIX,
    ),
    response_id_reader=ResponseIdReader((A.OI_OUTPUT_VALUE, A.OI_SPAN_KIND), response_id),
)
