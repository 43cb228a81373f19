"""What each replica serves: every release ack a publisher read, kept in the ``served_versions`` table.

An ack says what its replica serves under a name right after handling a command (read back from its
vLLM), so the latest ack per (replica, served name) is what that replica serves now, as far as the
bus has heard.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from schemas.lake import Lake
from schemas.tables import SERVED_VERSIONS

TABLE = "served_versions"


def record_acks(lake: Lake, acks: Iterable[dict[str, Any]]) -> int:
    """Append acks to ``served_versions``; how many."""
    now = dt.datetime.now(dt.UTC)
    rows = [{**ack, "recorded_at": now} for ack in acks]
    if rows:
        lake.write(TABLE, pa.Table.from_pylist(rows, schema=SERVED_VERSIONS))
    return len(rows)


def served_now(lake: Lake) -> list[dict[str, Any]]:
    """The latest ack per (replica, served name), sorted by both: what each replica serves now."""
    table = lake.table(TABLE)
    if table is None:
        return []
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["timestamp"]):
        latest[(row["replica"], row["served_name"])] = row
    return [latest[k] for k in sorted(latest)]
