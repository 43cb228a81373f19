"""Chat messages and tool definitions of an LLM span, read by the conventions into the internal shape.

Each convention's `MessageReader` (`pipelines.bronze.conventions`) knows its own layout; here the
readers a span's keys call for are asked in priority order, the first value of each of input, output
and tools wins, and the `spans` row holds each as JSON text. A message attribute that holds no
messages raises (the record is quarantined with the reason, never dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.bronze import conventions
from pipelines.bronze.conventions import MessageReader
from pipelines.bronze.conventions.internal import MalformedMessages
from pipelines.bronze.decoding.json_text import dumps

READERS = conventions.message_readers()


def readers_for(keys: Sequence[str]) -> tuple[MessageReader, ...]:
    """The readers a span with these attribute keys may hold messages or tools for, in priority order."""
    return tuple(
        r
        for r in READERS
        if any(k in r.keys for k in keys) or (r.prefixes and any(k.startswith(r.prefixes) for k in keys))
    )


def read_messages(
    readers: Sequence[MessageReader], attrs: Mapping[str, Any], span_name: str
) -> tuple[str | None, str | None, str | None]:
    """The span's input messages, output messages and tools as JSON text (None: not recorded)."""
    found: list[Any] = [None, None, None]
    try:
        for r in readers:
            if found[0] is None:
                found[0] = r.read(attrs, "input")
            if found[1] is None:
                found[1] = r.read(attrs, "output")
            if found[2] is None:
                found[2] = r.read_tools(attrs)
    except MalformedMessages as exc:
        raise MalformedMessages(f"span {span_name!r}: {exc}") from None
    return tuple(None if v is None else dumps(v) for v in found)  # type: ignore[return-value]
