"""The SQL agent: database, tasks, safe execution, parsing and reward (fast); a real-vLLM run (slow)."""

from __future__ import annotations

import json
from contextlib import closing

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from examples.sql_agent.agent import AGENT_NAME, run_batch, score
from examples.sql_agent.database import connect
from examples.sql_agent.sqlrun import SqlError, execute, parse_sql, results_match
from examples.sql_agent.tasks import SqlTask, heldout_tasks, make_tasks, split_of
from schemas import attributes as A


def test_database_is_deterministic_and_read_only() -> None:
    with closing(connect(0)) as a, closing(connect(0)) as b, closing(connect(1)) as c:
        dump = "SELECT * FROM customers, products LIMIT 50"
        assert a.execute(dump).fetchall() == b.execute(dump).fetchall() != c.execute(dump).fetchall()
        with pytest.raises(SqlError, match="only a single SELECT"):
            execute(a, "DELETE FROM orders")
        with pytest.raises(SqlError, match="one statement"):
            execute(a, "SELECT 1; DROP TABLE orders")
        assert execute(b, "SELECT COUNT(*) FROM orders").rows == ((60,),)


def test_runaway_and_oversized_queries_are_stopped() -> None:
    with closing(connect(0)) as conn:
        with pytest.raises(SqlError):
            execute(conn, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n")
        with pytest.raises(SqlError, match="more than"):
            execute(conn, "SELECT * FROM orders", max_rows=10)
        with pytest.raises(SqlError, match="no such column"):
            execute(conn, "SELECT colour FROM products")


def test_tasks_are_deterministic_distinct_and_answerable() -> None:
    train, again, heldout = make_tasks(40, seed=3), make_tasks(40, seed=3), heldout_tasks(32)
    assert train == again
    assert len({t.task_id for t in train}) == 40 and len({t.question for t in train}) == 40
    assert not {t.question for t in train} & {t.question for t in heldout}
    assert all(split_of(t.question) == "heldout" for t in heldout)
    with closing(connect(0)) as conn:
        for t in train + heldout:
            assert execute(conn, t.gold_sql).rows, t.question
    assert any(t.ordered for t in heldout) and any("JOIN" in t.gold_sql for t in heldout)


@pytest.mark.parametrize(
    ("text", "sql"),
    [
        ("SQL: SELECT name FROM customers WHERE age > 40;\nmore", "SELECT name FROM customers WHERE age > 40"),
        ("Sure:\n```sql\nSELECT name\nFROM products;\n```", "SELECT name\nFROM products"),
        ("select count(*) from orders", "select count(*) from orders"),
        ("SQL: SELECT 1", "SELECT 1"),
        ("I cannot answer that.", None),
    ],
)
def test_parse_sql(text: str, sql: str | None) -> None:
    assert parse_sql(text) == sql


def test_results_match_ignores_order_unless_it_matters() -> None:
    assert results_match([("a",), ("b",)], [("b",), ("a",)], ordered=False)
    assert not results_match([("a",), ("b",)], [("b",), ("a",)], ordered=True)
    assert not results_match([("a",), ("a",)], [("a",)], ordered=False)  # multisets, not sets
    assert results_match([(3.0,)], [(3,)], ordered=False) and results_match([(2.50000001,)], [(2.5,)], ordered=True)
    assert not results_match([("a", 1)], [("a",)], ordered=False)


def test_score_is_execution_match() -> None:
    task = SqlTask(
        "t",
        "List the names of all products in the books category.",
        "SELECT name FROM products WHERE category = 'books'",
    )
    assert score(task, "SELECT name FROM products WHERE category = 'books' ORDER BY name DESC") == 1.0
    assert score(task, "SELECT p.name FROM products p WHERE p.category LIKE 'book%'") == 1.0
    assert score(task, "SELECT * FROM products WHERE category = 'books'") == 0.0
    assert score(task, "SELECT name FROM nowhere") == 0.0
    top = SqlTask("k", "two most expensive", "SELECT name FROM products ORDER BY price DESC LIMIT 2", ordered=True)
    assert score(top, "SELECT name FROM products ORDER BY price DESC LIMIT 2") == 1.0
    assert score(top, "SELECT name FROM products ORDER BY price ASC LIMIT 2") == 0.0


@pytest.mark.slow
def test_sql_agent_against_real_vllm(vllm_server) -> None:  # noqa: ANN001 - session fixture
    """A few held-out tasks through real vLLM: rewards in [0, 1], one rollout span and one reward per task."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tasks = heldout_tasks(4)
    results = run_batch(
        vllm_server.url,
        tasks,
        model=vllm_server.served_name,
        concurrency=2,
        temperature=0.0,
        tracer=provider.get_tracer("test"),
    )
    assert [r.task_id for r in results] == [t.task_id for t in tasks]
    assert all(0.0 <= r.reward <= 1.0 and 1 <= r.calls <= 2 for r in results)
    assert all(m == vllm_server.served_name for r in results for m in r.models)
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == A.ROLLOUT_SPAN_NAME]
    rewards = [s for s in spans if s.name == A.REWARD_SPAN_NAME]
    assert len(roots) == len(rewards) == len(tasks)
    by_rollout = {s.attributes[A.ROLLOUT_ID]: s for s in rewards}
    for r in results:
        root = next(s for s in roots if s.attributes[A.ROLLOUT_ID] == r.rollout_id)
        assert root.attributes[A.TASK_ID] == r.task_id and root.attributes[A.AGENT_NAME] == AGENT_NAME
        reward_span = by_rollout[r.rollout_id]
        assert reward_span.attributes[A.REWARD_VALUE] == r.reward
        assert reward_span.parent is not None and reward_span.parent.span_id == root.context.span_id
    print(json.dumps([{"task": r.task_id, "sql": r.sql, "reward": r.reward} for r in results]))
