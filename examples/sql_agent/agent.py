"""The text-to-SQL agent: one chat call writes a query; an SQL error goes back once for a retry.

Like the math agent it knows nothing about training. It calls an OpenAI-compatible endpoint (the
agentlake gateway), wraps each task in an ``agentlake.rollout`` span carrying the rollout, task
and agent ids, propagates ``traceparent`` so the gateway's LLM spans join the trace, and records
the execution-match outcome as an ``agentlake.reward`` span (all three through ``examples.common``).
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry import trace

from examples.common import ChatRolloutResult, chat_turn, rollout_span, run_rollouts, turn_seed
from examples.sql_agent.database import connect
from examples.sql_agent.sqlrun import SqlError, execute, parse_sql, results_match
from examples.sql_agent.tasks import SqlTask, initial_messages

AGENT_NAME = "sql-agent"
NO_SQL = "ERROR: no query found. Answer with one line `SQL: <query>;`."
# Stop at the end of the statement (or a blank line), so one query comes back and nothing after it.
STOP = [";", "\n\n"]


@dataclass(kw_only=True)
class RolloutResult(ChatRolloutResult):
    sql: str | None = None
    error: str | None = None


def score(task: SqlTask, sql: str) -> float:
    """1.0 when ``sql`` returns the gold query's rows (in order only if the task fixes one), else 0.0."""
    with closing(connect(task.db_seed)) as conn:
        gold = execute(conn, task.gold_sql).rows
        try:
            predicted = execute(conn, sql).rows
        except SqlError:
            return 0.0
    return 1.0 if results_match(predicted, gold, ordered=task.ordered) else 0.0


def run_rollout(
    client: httpx.Client,
    task: SqlTask,
    *,
    model: str,
    retries: int = 1,
    temperature: float = 0.8,
    max_tokens: int = 96,
    tracer: trace.Tracer | None = None,
    reward_span: bool = True,
    seed: int | None = None,
) -> RolloutResult:
    """Answer one question with SQL; the reward is its execution match with the gold query.

    ``reward_span=False``: the trace carries no reward (production traffic posts it later). ``seed``: the
    rollout's sampling seed (try ``k`` samples with ``seed + k``), for paired evaluations.
    """
    result = RolloutResult(task_id=task.task_id, transcript=initial_messages(task))
    tracer = tracer or trace.get_tracer("examples.sql_agent")
    span = rollout_span(tracer, result, AGENT_NAME, reward_span=reward_span)
    with span, closing(connect(task.db_seed)) as db:
        for attempt in range(1 + retries):
            text = chat_turn(
                client,
                result,
                model=model,
                temperature=temperature,
                max_tokens=max_tokens,
                stop=STOP,
                seed=turn_seed(seed, attempt),
            )
            sql = parse_sql(text)
            if sql is None:
                result.error = "no query"
                result.transcript.append({"role": "user", "content": NO_SQL})
                continue
            result.sql = sql
            try:
                execute(db, sql)
            except SqlError as exc:
                result.error = str(exc)
                result.transcript.append({"role": "user", "content": f"ERROR: {exc}"})
                continue
            result.error = None
            break
        result.reward = score(task, result.sql) if result.sql and result.error is None else 0.0
    return result


def run_batch(
    base_url: str, tasks: list[SqlTask], *, model: str, concurrency: int = 4, **kwargs: Any
) -> list[RolloutResult]:
    """Run ``tasks`` concurrently against ``base_url`` (the gateway, or vLLM directly for evaluation)."""
    return run_rollouts(run_rollout, base_url, tasks, model=model, concurrency=concurrency, **kwargs)
