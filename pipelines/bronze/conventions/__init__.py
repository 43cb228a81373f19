"""The trace conventions decoding reads, one module each, merged here in priority order.

To read a new convention: write a module with one `Convention` (`base.py` says what each field
means) and add it to ``CONVENTIONS``. For each column, the keys of earlier conventions win over
later ones (ours first: the gateway's exact ids beat what an instrumentation guessed).
"""

from __future__ import annotations

from pipelines.bronze.conventions.agentlake import AGENTLAKE
from pipelines.bronze.conventions.agentlightning import AGENT_LIGHTNING
from pipelines.bronze.conventions.base import COLUMN_FIELDS, Convention, FlatMessages, ResponseIdReader
from pipelines.bronze.conventions.gen_ai import GEN_AI, GEN_AI_PRE_1_37
from pipelines.bronze.conventions.openinference import OPENINFERENCE

CONVENTIONS: list[Convention] = [AGENTLAKE, GEN_AI, OPENINFERENCE, GEN_AI_PRE_1_37, AGENT_LIGHTNING]


def keys(field: str) -> tuple[str, ...]:
    """Every convention's keys for ``field`` (a `Convention` field), in priority order."""
    return tuple(k for c in CONVENTIONS for k in getattr(c, field))


def flat_messages() -> tuple[FlatMessages, ...]:
    """The flattened-message layouts, in priority order."""
    return tuple(c.flat_messages for c in CONVENTIONS if c.flat_messages is not None)


def response_id_readers() -> tuple[ResponseIdReader, ...]:
    """The response-id readers, in priority order."""
    return tuple(c.response_id_reader for c in CONVENTIONS if c.response_id_reader is not None)


def reward_spans() -> dict[str, Convention]:
    """The conventions that carry rewards on spans, by their reward span's name."""
    return {c.reward_span_name: c for c in CONVENTIONS if c.reward_span_name is not None}


def typed_keys() -> frozenset[str]:
    """Keys held in a typed column of `spans` or `rewards`: not repeated in the JSON of the other attributes."""
    return frozenset(
        {*(k for f in COLUMN_FIELDS for k in keys(f)), *(k for c in CONVENTIONS for k in c.reward_columns)}
    )


__all__ = [
    "CONVENTIONS",
    "Convention",
    "FlatMessages",
    "ResponseIdReader",
    "flat_messages",
    "keys",
    "response_id_readers",
    "reward_spans",
    "typed_keys",
]
