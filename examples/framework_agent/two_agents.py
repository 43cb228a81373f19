"""The math task by two Agents SDK agents, a planner and a solver, each trained as its own policy line.

The planner reads the question and states the arithmetic in one line; the solver gets the question
and that plan and runs the calculator protocol (``examples.framework_agent.agent``'s loop). Listed in
``trainer.agents = ["planner", "solver"]``, each agent gets its own LoRA (``trainer.lines``):
both agents call the one served name, ``agentlake-policy``, and the client names the rollout's
current agent in the ``x-agentlake-agent`` header (``agentlake.headers()``, sent by ``make_client``),
so the gateway sends each call to ``agentlake-policy-<agent>`` and records that line's version; their
spans carry ``agentlake.agent.name``, so each line trains on its own agent's calls only. The
rollout's reward (the solver's answer) is both agents' reward.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner
from agents import trace as agents_trace
from openai import AsyncOpenAI

import agentlake
from examples.framework_agent.agent import RolloutResult, make_agent, make_client, solve_turns
from examples.math_agent.calculator import is_correct
from examples.math_agent.tasks import WORKED_EXAMPLE, MathTask

PLANNER, SOLVER = "planner", "solver"
PLANNER_PROMPT = (
    "Restate the question as the one arithmetic operation that answers it, e.g. 'multiply 12 by 7'. "
    "Reply with that line only."
)


def make_planner(client: AsyncOpenAI, model: str, *, temperature: float, max_tokens: int = 24) -> Agent:
    """One call per rollout: the question in, one line of plan out."""
    return Agent(
        name=PLANNER,
        instructions=PLANNER_PROMPT,
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=temperature, max_tokens=max_tokens, extra_args={"stop": ["\n"]}),
    )


async def run_rollout(planner: Agent, solver: Agent, task: MathTask, *, max_turns: int = 4) -> RolloutResult:
    """Plan, then solve; the reward is 1 for the exact final answer, else 0.

    The rollout's agent name is switched between the phases, so every span started in a phase (the
    instrumentation's LLM spans included) is stamped with that phase's agent, and every request names
    it to the gateway.
    """
    with agentlake.rollout(task_id=task.task_id, agent_name=PLANNER) as r:
        assert r.rollout_id is not None
        result = RolloutResult(task_id=task.task_id, rollout_id=r.rollout_id)
        with agents_trace("math rollout, two agents", group_id=r.rollout_id):
            planned = await Runner.run(planner, [{"role": "user", "content": task.question}], max_turns=1)
            result.calls += 1
            plan = str(planned.final_output or "").strip()
            r.agent_name = SOLVER
            history: list[Any] = [*WORKED_EXAMPLE, {"role": "user", "content": f"{task.question}\nPlan: {plan}"}]
            history = await solve_turns(solver, history, result, max_turns=max_turns)
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
        r.emit_reward(result.reward)
        result.transcript = history
    return result


async def run_batch_async(
    base_url: str,
    tasks: list[MathTask],
    *,
    model: str = "agentlake-policy",
    concurrency: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 40,
    max_turns: int = 4,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RolloutResult]:
    """Run ``tasks`` with at most ``concurrency`` in flight; call ``agent.setup`` first."""
    client = make_client(base_url, transport=transport)
    planner = make_planner(client, model, temperature=temperature)
    solver = make_agent(client, model, temperature=temperature, max_tokens=max_tokens).clone(name=SOLVER)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: MathTask) -> RolloutResult:
        async with gate:
            return await run_rollout(planner, solver, task, max_turns=max_turns)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await client.close()


def run_batch(base_url: str, tasks: list[MathTask], **kwargs: Any) -> list[RolloutResult]:
    """Synchronous ``run_batch_async``."""
    return asyncio.run(run_batch_async(base_url, tasks, **kwargs))
