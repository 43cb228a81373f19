"""The interface of a trace convention: which span attributes say what, for the `spans` columns.

A convention names the attributes it writes for each typed column of `spans` (ids, agent, model,
token ids, ...) and, where a value needs more than a key, a small reader (messages: `MessageReader`). Decoding merges
the registered conventions (`pipelines.bronze.conventions.CONVENTIONS`, in priority order): for each
column, the first key with a value wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pipelines.bronze.conventions.internal import Message, Tool

Attributes = Mapping[str, Any]
Direction = Literal["input", "output"]


@dataclass(frozen=True)
class MessageReader:
    """How a convention records chat messages and tool definitions, read into the internal shape
    (`pipelines.bronze.conventions.internal`).

    A reader is asked only for spans with one of ``keys`` (attributes that hold a whole list: kept in
    their column, not repeated in the JSON of the other attributes) or a key starting with one of
    ``prefixes`` (flattened layouts, one attribute per field). ``read`` and ``read_tools`` return None
    when the span has nothing of theirs, and raise `internal.MalformedMessages` when an attribute is
    there but holds no messages.
    """

    read: Callable[[Attributes, Direction], list[Message] | None]
    read_tools: Callable[[Attributes], list[Tool] | None]
    keys: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResponseIdReader:
    """A response id read from other attributes (only when no response-id key is present).

    ``read`` is called with the span's attributes when every key of ``needs`` is there.
    """

    needs: tuple[str, ...]
    read: Callable[[Attributes], str | None]


@dataclass(frozen=True)
class Convention:
    """One trace convention: the attribute keys it writes for each column, in its own priority order."""

    name: str
    rollout_id: tuple[str, ...] = ()
    attempt_id: tuple[str, ...] = ()
    task_id: tuple[str, ...] = ()
    agent_name: tuple[str, ...] = ()
    rollout_status: tuple[str, ...] = ()
    response_id: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    policy_version: tuple[str, ...] = ()
    policy_sha256: tuple[str, ...] = ()
    prompt_token_ids: tuple[str, ...] = ()
    completion_token_ids: tuple[str, ...] = ()
    completion_logprobs: tuple[str, ...] = ()
    # chat messages and tool definitions (`spans.input_messages`, `output_messages`, `tools`)
    messages: MessageReader | None = None
    response_id_reader: ResponseIdReader | None = None
    # a span of this name carries a reward (its value: `schemas.span_checks.reward_attribute`)
    reward_span_name: str | None = None
    reward_name_key: str | None = None  # the attribute naming that reward (absent: primary)
    reward_columns: tuple[str, ...] = ()  # reward attributes the `rewards` columns hold (not repeated in JSON)


COLUMN_FIELDS = (
    "rollout_id",
    "attempt_id",
    "task_id",
    "agent_name",
    "rollout_status",
    "response_id",
    "model",
    "policy_version",
    "policy_sha256",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
)
"""The fields of `Convention` that name typed columns' keys: held in their column, not in the JSON one."""
