"""Policy lines: one LoRA per trained agent, all served by one vLLM.

With ``trainer.agents = ["planner", "solver"]`` each listed agent has a line of its own in
``model_versions`` (column ``agent``): versions trained only on that agent's transitions, each
continuing the line's serving version, served as ``<model.served_name>-<agent>``
(``agentlake-policy-planner``) by vLLM's multi-LoRA. A round trains every line that has enough new
rows and leaves the others' versions alone. The gateway routes a call to ``agentlake-policy`` that
names a listed agent (``x-agentlake-agent``) to that agent's line. Unset: one line, the single policy
``model.served_name``, trained on every agent's rows, exactly as before.

vLLM should hold every served adapter at once, each line's and the single policy's (which the agents
not listed keep calling): ``--max-loras`` (in ``vllm.extra_args``) at least the number of agents plus
one, else vLLM (default 1) swaps adapters in and out between batches (``max_loras_warning``).
"""

from __future__ import annotations

import logging
from typing import Any

from schemas.agent_filter import matching_agents
from schemas.config import Settings
from schemas.config.serving import policy_served_name
from trainer.round import RoundResult, count_pending, train_once

log = logging.getLogger(__name__)

SINGLE: list[str | None] = [None]


def policy_lines(settings: Settings) -> list[str | None]:
    """The lines a round trains: each listed agent, or the single policy (None) when none is listed."""
    return list(settings.trainer.agents) or list(SINGLE)


def served_names(settings: Settings) -> dict[str | None, str]:
    """Line -> the name vLLM serves it under."""
    return {a: policy_served_name(settings.model.served_name, a) for a in policy_lines(settings)}


def train_lines(settings: Settings, *, force: bool = False, **overrides: Any) -> list[RoundResult]:
    """One round per line (each skipped or trained on its own agent's new rows), in the listed order.

    An ``agent`` override (``agentlake train --agent``) picks the lines whose agent its glob matches;
    without listed agents it filters the single policy's rows, as it always did."""
    warning = max_loras_warning(settings)
    if warning:
        log.warning(warning)
    lines = policy_lines(settings)
    if settings.trainer.agents and overrides.get("agent") is not None:
        chosen = matching_agents(overrides.pop("agent"), settings.trainer.agents)
        lines = [line for line in lines if line in chosen]
    return [train_once(settings, force=force, line=line, **overrides) for line in lines]


def count_pending_lines(settings: Settings, **overrides: Any) -> tuple[int, int | None]:
    """(most new transitions any line's next round would take, the table version read): the sensor's count."""
    from trainer.config import config_from_settings

    cfg = config_from_settings(settings, **overrides)
    counts = [count_pending(cfg, line=line) for line in policy_lines(settings)]
    return max(n for n, _ in counts), counts[0][1]


def max_loras_warning(settings: Settings) -> str | None:
    """Why vLLM would not hold every served adapter (each line's and the single policy's) at once, or None.

    Without ``--max-loras`` in ``vllm.extra_args`` the stack passes enough (``agentlake.stack.vllm``);
    one given there is the operator's and is checked."""
    if not settings.trainer.agents:
        return None
    lines = len(settings.trainer.agents) + 1
    args = list(settings.vllm.extra_args)
    given = None if any(a == "--max-loras" or a.startswith("--max-loras=") for a in args) else str(lines)
    for i, arg in enumerate(args):
        if arg.startswith("--max-loras="):
            given = arg.split("=", 1)[1]
        elif arg == "--max-loras" and i + 1 < len(args):
            given = args[i + 1]
    if given is not None and given.isdigit() and int(given) >= lines:
        return None
    return (
        f"{lines} served adapters (trainer.agents and the single policy) but vLLM holds {given or 1} per batch: "
        f'add "--max-loras", "{lines}" to vllm.extra_args'
    )
