"""Which attribute feeds which typed column of `spans`, decided once per resource and per key set.

Several conventions name the same thing (``agentlake.rollout.id``, ``agentlightning.rollout_id``;
``agentlake.agent.name``, ``gen_ai.agent.name``, ...): the first key with a value wins, in
``schemas.attributes``' order, as ``schemas.span_checks.first_present`` picks it. Keys that become
typed columns are not repeated in the JSON column of the other attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.bronze.decoding.json_text import dumps
from pipelines.bronze.decoding.messages import FLAT_MESSAGE_PREFIXES
from schemas import attributes as A
from schemas.otlp.values import lite_value

TYPED_KEYS = frozenset(
    {
        *A.ROLLOUT_ID_KEYS,
        *A.ATTEMPT_ID_KEYS,
        A.TASK_ID,
        *A.AGENT_NAME_KEYS,
        A.ROLLOUT_STATUS,
        *A.RESPONSE_ID_KEYS,
        *A.MODEL_KEYS,
        A.LLM_POLICY_VERSION,
        A.LLM_POLICY_SHA256,
        *A.PROMPT_TOKEN_IDS_KEYS,
        *A.COMPLETION_TOKEN_IDS_KEYS,
        A.LLM_COMPLETION_LOGPROBS,
        A.GEN_AI_INPUT_MESSAGES,
        A.GEN_AI_OUTPUT_MESSAGES,
        A.REWARD_VALUE,
        A.REWARD_NAME,
    }
)


def first_value(keys: Sequence[str], attrs: Mapping[str, Any]) -> Any:
    """The value of the first of ``keys`` that is neither None nor an empty string."""
    for k in keys:
        v = attrs.get(k)
        if v is not None and (v.__class__ is not str or v):
            return v
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
        self.rollout = first_value(A.ROLLOUT_ID_KEYS, res)
        self.attempt = first_value(A.ATTEMPT_ID_KEYS, res)
        self.task = first_value((A.TASK_ID,), res)
        self.agent = first_value(A.AGENT_NAME_KEYS, res)
        self.service = as_text(res.get(A.SERVICE_NAME))


class Shape:
    """What a span's attribute keys alone decide, worked out once per distinct tuple of keys.

    Spans of one agent carry the same keys over and over, so which keys feed which typed column,
    which go to the JSON column and whether flattened messages may be present is looked up, not
    recomputed for every span. Values still go through the same checks (empty strings skipped).
    """

    __slots__ = (
        "rollout",
        "attempt",
        "task",
        "agent",
        "status",
        "response",
        "oi_output",
        "model",
        "policy",
        "policy_sha",
        "prompt",
        "completion",
        "logprobs",
        "msg_in",
        "msg_out",
        "flat",
        "rest",
        "all_rest",
    )

    def __init__(self, keys: tuple[str, ...]) -> None:
        def present(candidates: Sequence[str]) -> tuple[str, ...]:
            return tuple(k for k in candidates if k in keys)

        self.rollout = present(A.ROLLOUT_ID_KEYS)
        self.attempt = present(A.ATTEMPT_ID_KEYS)
        self.task = present((A.TASK_ID,))
        self.agent = present(A.AGENT_NAME_KEYS)
        self.status = present((A.ROLLOUT_STATUS,))
        self.response = present(A.RESPONSE_ID_KEYS)
        # OpenInference's OpenAI instrumentation records no response id, only the raw response
        self.oi_output = not self.response and A.OI_OUTPUT_VALUE in keys and A.OI_SPAN_KIND in keys
        self.model = present(A.MODEL_KEYS)
        self.policy = present((A.LLM_POLICY_VERSION,))
        self.policy_sha = present((A.LLM_POLICY_SHA256,))
        self.prompt = present(A.PROMPT_TOKEN_IDS_KEYS)
        self.completion = present(A.COMPLETION_TOKEN_IDS_KEYS)
        self.logprobs = present((A.LLM_COMPLETION_LOGPROBS,))
        self.msg_in = A.GEN_AI_INPUT_MESSAGES in keys
        self.msg_out = A.GEN_AI_OUTPUT_MESSAGES in keys
        self.flat = any(k.startswith(FLAT_MESSAGE_PREFIXES) for k in keys)
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
