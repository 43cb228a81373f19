"""Running the agent's SQL safely, reading SQL out of its reply, and the execution-match reward."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_ROWS = 200
MAX_VM_STEPS = 2_000_000  # sqlite progress-handler ticks: a runaway cross join is stopped, not waited for


class SqlError(ValueError):
    """The query was refused or failed; the message goes back to the model as an observation."""


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


_STATEMENT = re.compile(r"^\s*(select|with)\b", re.IGNORECASE)


def execute(conn: sqlite3.Connection, sql: str, *, max_rows: int = MAX_ROWS) -> QueryResult:
    """One read-only SELECT; anything else, a second statement or a runaway query raises ``SqlError``."""
    sql = sql.strip().rstrip(";").strip()
    if not _STATEMENT.match(sql):
        raise SqlError("only a single SELECT statement is allowed")
    if ";" in sql:
        raise SqlError("only one statement is allowed")
    ticks = 0

    def guard() -> int:
        nonlocal ticks
        ticks += 1
        return 1 if ticks > MAX_VM_STEPS // 1000 else 0

    conn.set_progress_handler(guard, 1000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.Error as exc:
        raise SqlError(str(exc) or type(exc).__name__) from exc
    finally:
        conn.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        raise SqlError(f"the query returned more than {max_rows} rows")
    columns = tuple(d[0] for d in cursor.description or ())
    return QueryResult(columns=columns, rows=tuple(tuple(r) for r in rows))


def _norm(value: Any) -> Any:
    """Numbers compare by value (3 == 3.0, 2.5000001 == 2.5); text compares as is."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        rounded = round(float(value), 4)
        return int(rounded) if rounded.is_integer() else rounded
    return value


def results_match(predicted: Sequence[Sequence[Any]], gold: Sequence[Sequence[Any]], *, ordered: bool) -> bool:
    """Execution match: same rows (as multisets, or as lists when the question fixes an order)."""
    pred_rows = [tuple(_norm(v) for v in row) for row in predicted]
    gold_rows = [tuple(_norm(v) for v in row) for row in gold]
    if ordered:
        return pred_rows == gold_rows
    return Counter(pred_rows) == Counter(gold_rows)


_FENCE = re.compile(r"```(?:sql|sqlite)?\s*(.*?)(?:```|$)", re.IGNORECASE | re.DOTALL)
_SQL_LINE = re.compile(r"SQL:\s*(.+?)(?:\n\s*\n|$)", re.IGNORECASE | re.DOTALL)
_BARE = re.compile(r"^\s*((?:select|with)\b.*?)(?:\n\s*\n|$)", re.IGNORECASE | re.DOTALL)


def parse_sql(text: str) -> str | None:
    """The query in a reply: a ```sql fence, an ``SQL:`` line, or a reply that starts with SELECT."""
    for pattern in (_FENCE, _SQL_LINE, _BARE):
        found = pattern.search(text)
        if found and found.group(1).strip():
            sql = found.group(1).strip().strip("`").strip()
            return sql.split(";", 1)[0].strip() or None
    return None
