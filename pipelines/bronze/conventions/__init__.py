"""The trace conventions decoding reads, one module each, merged here in priority order.

To read a new convention: write a module with one `Convention` (`base.py` says what each field
means) and add it to ``CONVENTIONS``. For each column, the keys of earlier conventions win over
later ones (ours first: the gateway's exact ids beat what an instrumentation guessed).

Each convention's `MessageReader` maps its spans' messages and tools to one internal shape (OpenAI chat
messages with ``tool_calls`` / ``tool_call_id`` / ``reasoning_content``, OpenAI tool definitions;
`internal` spells it out), so the lake holds that shape whoever recorded the span:

- `agentlake`: our SDK and gateway (``agentlake.*``; the gateway's messages under the GenAI keys, its
  request tools under ``agentlake.llm.tools``);
- `gen_ai`: OTel GenAI 1.37+ (``gen_ai.input.messages`` / ``gen_ai.output.messages`` JSON parts,
  ``gen_ai.tool.definitions``): opentelemetry-instrumentation-openai-v2 and current OpenLLMetry;
- `openinference`: ``llm.input_messages.{i}.message.*`` with tool calls, ``llm.tools.{i}.tool.json_schema``;
- `gen_ai_pre_1_37`: the flattened ``gen_ai.prompt.{i}.*`` of older OpenLLMetry, with its tool calls
  and ``llm.request.functions.{i}.*``;
- `agentlightning`: ids, token ids and reward spans (its LLM spans' messages come from the
  instrumentation it wraps, read by the conventions above).

For each of input messages, output messages and tools, the first convention with a value wins.
"""

from __future__ import annotations

from pipelines.bronze.conventions.agentlake import AGENTLAKE
from pipelines.bronze.conventions.agentlightning import AGENT_LIGHTNING
from pipelines.bronze.conventions.base import COLUMN_FIELDS, Convention, MessageReader, ResponseIdReader
from pipelines.bronze.conventions.gen_ai import GEN_AI
from pipelines.bronze.conventions.gen_ai_pre_1_37 import GEN_AI_PRE_1_37
from pipelines.bronze.conventions.openinference import OPENINFERENCE

CONVENTIONS: list[Convention] = [AGENTLAKE, GEN_AI, OPENINFERENCE, GEN_AI_PRE_1_37, AGENT_LIGHTNING]


def keys(field: str) -> tuple[str, ...]:
    """Every convention's keys for ``field`` (a `Convention` field), in priority order."""
    return tuple(k for c in CONVENTIONS for k in getattr(c, field))


def message_readers() -> tuple[MessageReader, ...]:
    """The message readers, in priority order."""
    return tuple(c.messages for c in CONVENTIONS if c.messages is not None)


def response_id_readers() -> tuple[ResponseIdReader, ...]:
    """The response-id readers, in priority order."""
    return tuple(c.response_id_reader for c in CONVENTIONS if c.response_id_reader is not None)


def reward_spans() -> dict[str, Convention]:
    """The conventions that carry rewards on spans, by their reward span's name."""
    return {c.reward_span_name: c for c in CONVENTIONS if c.reward_span_name is not None}


def typed_keys() -> frozenset[str]:
    """Keys held in a typed column of `spans` or `rewards`: not repeated in the JSON of the other attributes."""
    return frozenset(
        {
            *(k for f in COLUMN_FIELDS for k in keys(f)),
            *(k for c in CONVENTIONS for k in c.reward_columns),
            *(k for r in message_readers() for k in r.keys),
        }
    )


__all__ = [
    "CONVENTIONS",
    "Convention",
    "MessageReader",
    "ResponseIdReader",
    "keys",
    "message_readers",
    "response_id_readers",
    "reward_spans",
    "typed_keys",
]
