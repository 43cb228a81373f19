"""agentlake: reinforcement learning for LLM agents, from the traces they already emit.

The agent-side API is small::

    import agentlake
    agentlake.init("http://127.0.0.1:4318")          # OTLP to the collector; instruments openai
    with agentlake.rollout(task_id="gsm8k-17"):
        ...                                          # every span in here carries the rollout ids
        agentlake.emit_reward(1.0)

Calls through the OpenAI client name the rollout and the agent (``init(agent_name=...)`` or
``rollout(agent_name=...)``) to the gateway in headers; raw HTTP calls add ``agentlake.headers()``.

Importing this package never imports torch, vLLM or Dagster.
"""

from agentlake._sdk.openai import instrument_openai, uninstrument_openai
from agentlake._sdk.reward_fns import RewardFn, Trajectory, reward_fn
from agentlake._sdk.setup import init
from agentlake._sdk.tracing import (
    Rollout,
    SdkError,
    current_rollout,
    emit_reward,
    flush,
    headers,
    reward,
    rollout,
    tracer_provider,
)

__all__ = [
    "RewardFn",
    "Rollout",
    "SdkError",
    "Trajectory",
    "current_rollout",
    "emit_reward",
    "flush",
    "headers",
    "init",
    "instrument_openai",
    "reward",
    "reward_fn",
    "rollout",
    "tracer_provider",
    "uninstrument_openai",
]
