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

from schemas.config.serving import policy_served_name
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


def against_registry(
    served: list[dict[str, Any]], registry_rows: Iterable[dict[str, Any]], served_name: str
) -> dict[tuple[str, str], str]:
    """(replica, served name) -> how what it serves compares with the registry: ``current`` when it serves the
    manifest of the version the registry publishes under that name, else why not (``stale``, ``unknown``).

    The registry says what *should* serve; an ack says what a replica *does* serve. A replica whose loader
    missed a release, or whose vLLM restarted onto an older folder, shows up here rather than as a model
    that seems to stop learning."""
    rows = list(registry_rows)
    published: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["publish_status"] == "published" and r["published_at"] is not None:
            name = policy_served_name(served_name, r.get("agent"))
            if name not in published or r["published_at"] > published[name]["published_at"]:
                published[name] = r
    known = {r.get("manifest_sha256"): r["version"] for r in rows if r.get("manifest_sha256")}
    out: dict[tuple[str, str], str] = {}
    for s in served:
        key = (s["replica"], s["served_name"])
        want = published.get(s["served_name"])
        sha = s.get("serving_sha256")
        if sha is None:
            out[key] = "serves nothing" + (f"; registry: {want['version']}" if want else "")
        elif want is not None and sha == want.get("manifest_sha256"):
            out[key] = "current"
        elif sha not in known:
            out[key] = "unknown adapter"  # its manifest matches no registry version
        elif want is None:
            out[key] = "stale; registry: nothing published"
        else:
            out[key] = f"stale; registry: {want['version']}"
    return out
