"""The judge's cache, the `judgements` table: a question asked before is answered from the lake.

A judgement's id hashes everything its answer depends on: the reward source (judge name, version,
and the fingerprint of rubric, model and prompt), the request's parameters, the members in order,
and the messages themselves (so a trajectory that changed since is a new question). A rerun, a
backfill, or a group scored again because one member was re-assembled with nothing new to show the
judge finds its id and makes no call; a changed rubric, version, membership or content does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from schemas.lake import Lake, in_list
from schemas.tables import JUDGEMENTS

TABLE = "judgements"
Member = tuple[str, str, str | None]  # (tenant, rollout id, attempt id)


def judgement_id(
    source: str, params: Mapping[str, Any], members: Sequence[Member], messages: Sequence[Mapping[str, str]]
) -> str:
    """The id of one question: the same for the same source, parameters, members and messages."""
    text = json.dumps([source, dict(params), [list(m) for m in members], list(messages)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(lake: Lake, ids: Collection[str]) -> dict[str, list[dict[str, Any]]]:
    """The stored rows of each of ``ids`` that has any, by position."""
    scan = lake.scan(TABLE)
    if scan is None or not ids:
        return {}
    rows = scan.filter(pl.col("judgement_id").is_in(sorted(ids))).sort("judgement_id", "position").collect()
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows.to_dicts():
        out.setdefault(row["judgement_id"], []).append(row)
    return out


def complete(rows: Sequence[Mapping[str, Any]], members: Sequence[Member]) -> bool:
    """Whether stored ``rows`` answer for exactly ``members`` (a forget may have removed some)."""
    return [(r["tenant"], r["rollout_id"], r["attempt_id"]) for r in rows] == list(members)


def store(lake: Lake, rows: Sequence[Mapping[str, Any]], *, now: dt.datetime | None = None) -> None:
    """Write judgements' rows in one commit, replacing any stored under the same ids."""
    if not rows:
        return
    stamp = now or dt.datetime.now(dt.UTC)
    table = pa.Table.from_pylist([{**r, "created_at": stamp} for r in rows], schema=JUDGEMENTS)
    ids = sorted({r["judgement_id"] for r in rows})
    exists = lake.table(TABLE) is not None
    lake.write(
        TABLE,
        table,
        mode="overwrite" if exists else "append",
        predicate=in_list("judgement_id", ids) if exists else None,
    )
