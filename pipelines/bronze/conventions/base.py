"""The interface of a trace convention: which span attributes say what, for the `spans` columns.

A convention names the attributes it writes for each typed column of `spans` (ids, agent, model,
token ids, messages, ...) and, where a value needs more than a key, a small reader. Decoding merges
the registered conventions (`pipelines.bronze.conventions.CONVENTIONS`, in priority order): for each
column, the first key with a value wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Attributes = Mapping[str, Any]


@dataclass(frozen=True)
class FlatMessages:
    """Messages flattened one attribute per field: ``{prefix}{i}.{role}`` / ``{prefix}{i}.{content}``."""

    input_prefix: str
    output_prefix: str
    role: str
    content: str


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
    # chat messages (tool calls included, as the convention writes them) in one JSON-list attribute
    input_messages: tuple[str, ...] = ()
    output_messages: tuple[str, ...] = ()
    flat_messages: FlatMessages | None = None
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
    "input_messages",
    "output_messages",
)
"""The fields of `Convention` that name typed columns' keys: held in their column, not in the JSON one."""
