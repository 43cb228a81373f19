"""The agents the closed loop can train: each one's training tasks, held-out tasks and rollout batch.

The loop is the same for every agent; what differs is which tasks a round draws, which tasks score
the policy before and after, and the function that runs a batch of rollouts through an
OpenAI-compatible server. ``AGENTS`` names them for ``--agent``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Result(Protocol):
    """What the loop reads from a rollout: its id and its reward."""

    rollout_id: str
    reward: float


RunBatch = Callable[..., Sequence[Result]]


@dataclass(frozen=True)
class AgentKit:
    """One example agent as the loop drives it."""

    name: str  # the agent name its spans carry (agentlake.agent.name)
    train_tasks: Callable[[int, int, str], list[Any]]  # (n, seed, id prefix) -> tasks, the same for the same seed
    heldout_tasks: Callable[[int], list[Any]]  # n -> the fixed held-out set, never drawn for training
    run_batch: RunBatch  # (base_url, tasks, model=, concurrency=, temperature=, ...) -> results in task order
    # Sequences per trainer micro-batch, when this agent's rows need fewer than the default at once (the same
    # batch by gradient accumulation); None: the settings' own.
    micro_batch: int | None = None


# The math kinds where the base policy is right only some of the time at its serving temperature:
# that is where rewards differ between rollouts and carry signal (the two-step kinds start at zero).
MATH_KINDS = ("multiply", "buy")
# The held-out set: the same two problems with larger numbers and other names, items and wording
# (examples/math_agent/tasks.py), where SmolLM2-135M starts near 0.58, not 0.8 (measured on CPU vLLM,
# docs/demo.md): room to show a gain. Training draws them too (other seeds): what it learns transfers.
HELD_OUT_KINDS = ("multiply_large", "buy_large")
TRAIN_KINDS = (*MATH_KINDS, *HELD_OUT_KINDS)
HELD_OUT_SEED = 10_000  # math training tasks use seeds below 10_000 (seed * 1000 + round)


def make_math_tasks(n: int, *, seed: int, prefix: str, kinds: tuple[str, ...]) -> list[Any]:
    from examples.math_agent.tasks import make_tasks

    return make_tasks(n, seed=seed, prefix=prefix, kinds=kinds)


def _math() -> AgentKit:
    from examples.math_agent.agent import AGENT_NAME, run_batch

    return AgentKit(
        name=AGENT_NAME,
        train_tasks=lambda n, seed, prefix: make_math_tasks(n, seed=seed, prefix=prefix, kinds=TRAIN_KINDS),
        # The same held-out set whatever the training seed, so runs are comparable.
        heldout_tasks=lambda n: make_math_tasks(n, seed=HELD_OUT_SEED, prefix="heldout", kinds=HELD_OUT_KINDS),
        run_batch=run_batch,
    )


def _sql() -> AgentKit:
    from examples.sql_agent.agent import AGENT_NAME, run_batch
    from examples.sql_agent.tasks import heldout_tasks, make_tasks

    return AgentKit(
        name=AGENT_NAME,
        # Question texts are split by hash: training never draws a held-out question.
        train_tasks=lambda n, seed, prefix: make_tasks(n, seed=seed, prefix=prefix),
        heldout_tasks=heldout_tasks,
        run_batch=run_batch,
    )


def _tools() -> AgentKit:
    from examples.tool_agents.native import AGENT_NAME, run_batch

    return AgentKit(
        name=AGENT_NAME,
        train_tasks=lambda n, seed, prefix: make_math_tasks(n, seed=seed, prefix=prefix, kinds=TRAIN_KINDS),
        heldout_tasks=lambda n: make_math_tasks(n, seed=HELD_OUT_SEED, prefix="heldout", kinds=HELD_OUT_KINDS),
        run_batch=run_batch,
        # Its rows hold the tool definitions, a worked tool call and the call's result (~500 tokens): 8 of
        # them at once peaked near 10 GB in the trainer (its logits over a 49k vocabulary) and were killed
        # for memory on a 24 GB machine running a vLLM next to it.
        micro_batch=2,
    )


AGENTS: dict[str, Callable[[], AgentKit]] = {"math": _math, "sql": _sql, "tools": _tools}


def agent_kit(name: str) -> AgentKit:
    """The kit for ``--agent name``; an unknown name lists the known ones."""
    try:
        return AGENTS[name]()
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; choose from {', '.join(AGENTS)}") from None
