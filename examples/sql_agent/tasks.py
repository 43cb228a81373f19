"""Text-to-SQL tasks: questions over the generated shop database, each with a gold query.

Questions come from templates filled with values drawn from the database itself, so every
question has a non-empty, unambiguous answer. A stable hash of the question text puts it in the
``train`` or the ``heldout`` split, so the held-out set never shares a question with training,
whatever seeds either side uses. The prompt shows the schema and five worked examples: SmolLM2-135M
writes usable SQL only when shown the format (see DESIGN.md, "Learning signal").
"""

from __future__ import annotations

import random
import sqlite3
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from examples.sql_agent.database import connect
from examples.sql_agent.sqlrun import execute

Split = Literal["train", "heldout"]
HELDOUT_EVERY = 4  # one question text in four is held out


@dataclass(frozen=True)
class SqlTask:
    task_id: str
    question: str
    gold_sql: str
    ordered: bool = False  # the question fixes the row order (ORDER BY ... LIMIT), so order must match
    db_seed: int = 0


def _q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _values(conn: sqlite3.Connection, sql: str) -> list:
    return [row[0] for row in conn.execute(sql).fetchall()]


Template = Callable[[random.Random, sqlite3.Connection], tuple[str, str, bool]]


def _count_city(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    city = rng.choice(_values(conn, "SELECT DISTINCT city FROM customers ORDER BY city"))
    return f"How many customers live in {city}?", f"SELECT COUNT(*) FROM customers WHERE city = {_q(city)}", False


def _older_than(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    age = rng.randint(25, 70)
    return (f"List the names of customers older than {age}.", f"SELECT name FROM customers WHERE age > {age}", False)


def _price_of(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    name = rng.choice(_values(conn, "SELECT name FROM products ORDER BY id"))
    return f"What is the price of the {name}?", f"SELECT price FROM products WHERE name = {_q(name)}", False


def _in_category(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    category = rng.choice(_values(conn, "SELECT DISTINCT category FROM products ORDER BY category"))
    return (
        f"List the names of all products in the {category} category.",
        f"SELECT name FROM products WHERE category = {_q(category)}",
        False,
    )


def _cheaper_than(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    price = rng.randint(8, 80)
    return (
        f"Which products cost less than {price} dollars? Give their names.",
        f"SELECT name FROM products WHERE price < {price}",
        False,
    )


def _count_pricier(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    price = rng.randint(8, 80)
    return (
        f"How many products cost more than {price} dollars?",
        f"SELECT COUNT(*) FROM products WHERE price > {price}",
        False,
    )


def _live_in(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    city = rng.choice(_values(conn, "SELECT DISTINCT city FROM customers ORDER BY city"))
    return (
        f"Which customers live in {city}? Give their names.",
        f"SELECT name FROM customers WHERE city = {_q(city)}",
        False,
    )


def _average_price(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    category = rng.choice(_values(conn, "SELECT DISTINCT category FROM products ORDER BY category"))
    return (
        f"What is the average price of products in the {category} category?",
        f"SELECT AVG(price) FROM products WHERE category = {_q(category)}",
        False,
    )


def _most_expensive(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    k = rng.randint(2, 5)
    return (
        f"List the names of the {k} most expensive products, most expensive first.",
        f"SELECT name FROM products ORDER BY price DESC LIMIT {k}",
        True,
    )


def _cheapest_in(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    k = rng.randint(2, 3)
    category = rng.choice(_values(conn, "SELECT DISTINCT category FROM products ORDER BY category"))
    return (
        f"List the names of the {k} cheapest products in the {category} category, cheapest first.",
        f"SELECT name FROM products WHERE category = {_q(category)} ORDER BY price LIMIT {k}",
        True,
    )


def _orders_of(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    name = rng.choice(
        _values(conn, "SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY c.name")
    )
    return (
        f"How many orders did {name} place?",
        "SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id "
        f"WHERE customers.name = {_q(name)}",
        False,
    )


def _units_of(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str, bool]:
    name = rng.choice(
        _values(conn, "SELECT DISTINCT p.name FROM products p JOIN orders o ON o.product_id = p.id ORDER BY p.name")
    )
    return (
        f"How many units of {name} were ordered in total?",
        "SELECT SUM(quantity) FROM orders JOIN products ON orders.product_id = products.id "
        f"WHERE products.name = {_q(name)}",
        False,
    )


TEMPLATES: tuple[Template, ...] = (
    _count_city,
    _older_than,
    _price_of,
    _in_category,
    _cheaper_than,
    _count_pricier,
    _live_in,
    _average_price,
    _most_expensive,
    _cheapest_in,
    _orders_of,
    _units_of,
)


def split_of(question: str) -> Split:
    """Which split a question belongs to, from a stable hash of its text."""
    return "heldout" if zlib.crc32(question.encode()) % HELDOUT_EVERY == 0 else "train"


def make_tasks(n: int, *, seed: int, split: Split = "train", prefix: str = "sql", db_seed: int = 0) -> list[SqlTask]:
    """``n`` distinct tasks of ``split``, the same for the same arguments; ids are stable for GRPO groups."""
    rng = random.Random(seed)
    conn = connect(db_seed)
    tasks: list[SqlTask] = []
    seen: set[str] = set()
    for attempt in range(200 * n + 1000):
        if len(tasks) == n:
            break
        question, gold, ordered = TEMPLATES[attempt % len(TEMPLATES)](rng, conn)
        if question in seen or split_of(question) != split:
            continue
        if not execute(conn, gold).rows:  # every gold answer is non-empty
            continue
        seen.add(question)
        tasks.append(
            SqlTask(
                task_id=f"{prefix}-{split}-{seed}-{len(tasks)}",
                question=question,
                gold_sql=gold,
                ordered=ordered,
                db_seed=db_seed,
            )
        )
    conn.close()
    if len(tasks) < n:
        raise ValueError(f"only {len(tasks)} distinct {split} questions exist for this database; ask for fewer")
    return tasks


def heldout_tasks(n: int = 32) -> list[SqlTask]:
    """The fixed held-out set used to score the agent before and after training."""
    return make_tasks(n, seed=1000, split="heldout", prefix="sql")


SYSTEM_PROMPT = (
    "You write SQLite queries. The tables are:\n"
    "customers(id, name, city, age)\n"
    "products(id, name, category, price)\n"
    "orders(id, customer_id, product_id, quantity, order_date)\n"
    "Answer with exactly one line `SQL: <query>;`. If you get `ERROR: <message>`, write a corrected `SQL:` line."
)

# Shapes like the templates', never one of their questions: one filter, one count, one lookup, one
# join and one ordered list, the least a 135M model needs to copy the format and the column names.
WORKED_EXAMPLE: list[dict[str, str]] = [
    {"role": "user", "content": "List the names of customers younger than 21."},
    {"role": "assistant", "content": "SQL: SELECT name FROM customers WHERE age < 21;"},
    {"role": "user", "content": "How many products are in the toys category?"},
    {"role": "assistant", "content": "SQL: SELECT COUNT(*) FROM products WHERE category = 'toys';"},
    {"role": "user", "content": "What is the category of the Mug?"},
    {"role": "assistant", "content": "SQL: SELECT category FROM products WHERE name = 'Mug';"},
    {"role": "user", "content": "How many orders did customers from Lima place?"},
    {
        "role": "assistant",
        "content": "SQL: SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = "
        "customers.id WHERE customers.city = 'Lima';",
    },
    {"role": "user", "content": "List the names of the 2 oldest customers, oldest first."},
    {"role": "assistant", "content": "SQL: SELECT name FROM customers ORDER BY age DESC LIMIT 2;"},
]


def initial_messages(task: SqlTask) -> list[dict[str, str]]:
    """The chat a rollout starts from: schema and format, the worked examples, the question."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        *WORKED_EXAMPLE,
        {"role": "user", "content": task.question},
    ]
