"""Which attribute feeds which typed column of `spans`, decided once per resource and per key set.

Several conventions name the same thing (``agentlake.rollout.id``, ``agentlightning.rollout_id``;
``agentlake.agent.name``, ``gen_ai.agent.name``, ...): the first key with a value wins, in the order
of ``pipelines.bronze.conventions.CONVENTIONS``. Keys that become
typed columns are not repeated in the JSON column of the other attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipelines.bronze import conventions
from pipelines.bronze.decoding.json_text import dumps
from pipelines.bronze.decoding.messages import readers_for
from schemas import attributes as A
from schemas.otlp.values import lite_value

TYPED_KEYS = conventions.typed_keys()
ROLLOUT_ID_KEYS = conventions.keys("rollout_id")
ATTEMPT_ID_KEYS = conventions.keys("attempt_id")
TASK_ID_KEYS = conventions.keys("task_id")
AGENT_NAME_KEYS = conventions.keys("agent_name")
_RESPONSE_ID_READERS = conventions.response_id_readers()


def first_value(keys: Sequence[str], attrs: Mapping[str, Any]) -> Any:
    """The value of the first of ``keys`` that is neither None nor an empty string."""
    for k in keys:
        v = attrs.get(k)
        if v is not None and (v.__class__ is not str or v):
            return v
    return None


def read_response_id(readers: Sequence[Callable[[Mapping[str, Any]], str | None]], attrs: Mapping[str, Any]) -> Any:
    """The first response id one of ``readers`` finds in ``attrs`` (None: none)."""
    for read in readers:
        if (found := read(attrs)) is not None:
            return found
    return None


def as_text(v: Any) -> str | None:
    return None if v is None else str(v)


class ResourceColumns:
    """What every span of one resource shares, worked out once: its attributes as dict and JSON."""

    __slots__ = ("attrs", "json", "rollout", "attempt", "task", "agent", "service")

    def __init__(self, kvs: Any) -> None:
        res = {kv.key: lite_value(kv.value) for kv in kvs}
        self.attrs = res
        self.json = dumps(res) if res else None
        self.rollout = first_value(ROLLOUT_ID_KEYS, res)
        self.attempt = first_value(ATTEMPT_ID_KEYS, res)
        self.task = first_value(TASK_ID_KEYS, res)
        self.agent = first_value(AGENT_NAME_KEYS, res)
        self.service = as_text(res.get(A.SERVICE_NAME))


class Shape:
    """What a span's attribute keys alone decide, worked out once per distinct tuple of keys.

    Spans of one agent carry the same keys over and over, so which keys feed which typed column,
    which go to the JSON column and which conventions' messages may be present is looked up, not
    recomputed for every span. Values still go through the same checks (empty strings skipped).
    """

    __slots__ = (
        "rollout",
        "attempt",
        "task",
        "agent",
        "status",
        "response",
        "response_readers",
        "model",
        "policy",
        "policy_sha",
        "prompt",
        "completion",
        "logprobs",
        "messages",
        "rest",
        "all_rest",
    )

    def __init__(self, keys: tuple[str, ...]) -> None:
        def present(candidates: Sequence[str]) -> tuple[str, ...]:
            return tuple(k for k in candidates if k in keys)

        self.rollout = present(ROLLOUT_ID_KEYS)
        self.attempt = present(ATTEMPT_ID_KEYS)
        self.task = present(TASK_ID_KEYS)
        self.agent = present(AGENT_NAME_KEYS)
        self.status = present(conventions.keys("rollout_status"))
        self.response = present(conventions.keys("response_id"))
        # without a response-id key, readers that find one elsewhere (OpenInference's raw response)
        self.response_readers = (
            () if self.response else tuple(r.read for r in _RESPONSE_ID_READERS if all(k in keys for k in r.needs))
        )
        self.model = present(conventions.keys("model"))
        self.policy = present(conventions.keys("policy_version"))
        self.policy_sha = present(conventions.keys("policy_sha256"))
        self.prompt = present(conventions.keys("prompt_token_ids"))
        self.completion = present(conventions.keys("completion_token_ids"))
        self.logprobs = present(conventions.keys("completion_logprobs"))
        self.messages = readers_for(keys)
        self.rest = tuple(k for k in keys if k not in TYPED_KEYS)
        self.all_rest = len(self.rest) == len(keys)


SHAPES: dict[tuple[str, ...], Shape] = {}
"""Shapes by key tuple: look here first, then ``new_shape``."""


def new_shape(keys: tuple[str, ...]) -> Shape:
    """The ``Shape`` of ``keys``, remembered in ``SHAPES``."""
    if len(SHAPES) > 4096:  # many distinct key sets (free-form attribute names): stay bounded
        SHAPES.clear()
    shape = SHAPES[keys] = Shape(keys)
    return shape
