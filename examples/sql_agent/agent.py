"""The text-to-SQL agent: one chat call writes a query; an SQL error goes back once for a retry.

Like the math agent it knows nothing about training. It calls an OpenAI-compatible endpoint (the
agentlake gateway), wraps each task in an ``agentlake.rollout`` span carrying the rollout, task
and agent ids, propagates ``traceparent`` so the gateway's LLM spans join the trace, and records
the execution-match outcome as an ``agentlake.reward`` span.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry import propagate, trace

from examples.sql_agent.database import connect
from examples.sql_agent.sqlrun import SqlError, execute, parse_sql, results_match
from examples.sql_agent.tasks import SqlTask, initial_messages
from schemas import attributes as attr

AGENT_NAME = "sql-agent"
NO_SQL = "ERROR: no query found. Answer with one line `SQL: <query>;`."


@dataclass
class RolloutResult:
    task_id: str
    rollout_id: str
    reward: float
    sql: str | None
    calls: int
    error: str | None = None
    models: list[str] = field(default_factory=list)
    transcript: list[dict[str, str]] = field(default_factory=list)


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
) -> RolloutResult:
    """Answer one question with SQL; the reward is its execution match with the gold query."""
    tracer = tracer or trace.get_tracer("examples.sql_agent")
    rollout_id = uuid.uuid4().hex
    messages = initial_messages(task)
    result = RolloutResult(task_id=task.task_id, rollout_id=rollout_id, reward=0.0, sql=None, calls=0)
    ids = {attr.ROLLOUT_ID: rollout_id, attr.TASK_ID: task.task_id, attr.AGENT_NAME: AGENT_NAME}
    span = tracer.start_as_current_span(attr.ROLLOUT_SPAN_NAME, attributes=ids)
    with span as root, closing(connect(task.db_seed)) as db:
        for _ in range(1 + retries):
            headers = {"x-agentlake-rollout-id": rollout_id}
            propagate.inject(headers)
            response = client.post(
                "/v1/chat/completions",
                headers=headers,
                json={
                    "model": model,
                    "messages": messages,
                    "temperature": temperature,
                    "max_tokens": max_tokens,
                    "stop": [";", "\n\n"],
                },
            )
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            result.calls += 1
            result.models.append(body.get("model", model))
            text = body["choices"][0]["message"]["content"] or ""
            messages.append({"role": "assistant", "content": text})
            sql = parse_sql(text)
            if sql is None:
                result.error = "no query"
                messages.append({"role": "user", "content": NO_SQL})
                continue
            result.sql = sql
            try:
                execute(db, sql)
            except SqlError as exc:
                result.error = str(exc)
                messages.append({"role": "user", "content": f"ERROR: {exc}"})
                continue
            result.error = None
            break
        result.reward = score(task, result.sql) if result.sql and result.error is None else 0.0
        with tracer.start_as_current_span(
            attr.REWARD_SPAN_NAME,
            attributes={**ids, attr.REWARD_VALUE: result.reward, attr.REWARD_NAME: attr.PRIMARY_REWARD_NAME},
        ):
            pass
        root.set_attribute(attr.ROLLOUT_STATUS, "finished")
    result.transcript = messages
    return result


def run_batch(
    base_url: str, tasks: list[SqlTask], *, model: str, concurrency: int = 4, **kwargs: Any
) -> list[RolloutResult]:
    """Run ``tasks`` concurrently against ``base_url`` (the gateway, or vLLM directly for evaluation)."""
    with httpx.Client(base_url=base_url, timeout=120) as client, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda t: run_rollout(client, t, model=model, **kwargs), tasks))
