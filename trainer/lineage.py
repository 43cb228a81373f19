"""Training lineage: the ``training_lineage`` Delta table (schema ``schemas.tables.TRAINING_LINEAGE``).

One row per (model version, transition it trained on), with the transitions table it came from
and the Delta version it was read at. It is what makes consumption exact: the next round's data
is ``transitions`` (at one pinned version) anti-joined with this table on ``transition_id``, so
compaction, vacuum and group rewrites, which move rows into new files without changing their ids,
never make old rows look new. A version trained on a credit variant (``transitions__<name>``,
``agentlake transitions rebuild``) names that table in ``train_table``; the credit settings its rows
were built with are in the table's Delta commit metadata (``recorded_credit``). In DuckDB (``agentlake query``):

    SELECT m.version, count(*) AS transitions, min(l.table_version), max(l.table_version)
    FROM model_versions m JOIN training_lineage l ON l.model_version = m.version
    JOIN transitions t USING (transition_id)
    GROUP BY 1 ORDER BY 1;
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from schemas.lake import Lake
from schemas.tables import CREDIT_METADATA_KEY, TRAINING_LINEAGE, base_table
from schemas.uris import normalize_uri

TABLE = "training_lineage"


class Lineage:
    """Read and append ``training_lineage`` rows of one lake."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.uri = lake.uri(TABLE)

    def _read(self, columns: list[str], where: pds.Expression) -> pa.Table:
        table = self.lake.table(TABLE)
        if table is None:
            return TRAINING_LINEAGE.empty_table().select(columns)
        return table.to_pyarrow_dataset().to_table(columns=columns, filter=where)

    def consumed_ids(self, train_table: str, *, since: dt.datetime | None = None) -> pa.Array:
        """Every transition id of ``train_table`` that some model version already trained on; ``since``:
        only those consumed at or after it (file statistics on ``consumed_at`` skip older rounds' files)."""
        where = pds.field("train_table") == normalize_uri(train_table)
        if since is not None:
            where = where & (pds.field("consumed_at") >= pa.scalar(since, TRAINING_LINEAGE.field("consumed_at").type))
        ids = self._read(["transition_id"], where)
        return pc.unique(ids["transition_id"]) if ids.num_rows else pa.array([], pa.string())

    def has_rows(self, model_version: str) -> bool:
        """Whether ``model_version``'s lineage rows were written (file statistics prune the other rounds' files)."""
        return self._read(["model_version"], pds.field("model_version") == model_version).num_rows > 0

    def record(self, *, model_version: str, train_table: str, table_version: int, rows: pa.Table) -> int:
        """Append one row per transition in ``rows`` (columns transition_id, rollout_id); the count."""
        n = rows.num_rows
        if n == 0:
            return 0
        now = dt.datetime.now(dt.UTC)
        data = pa.table(
            {
                "model_version": pa.array([model_version] * n, pa.string()),
                "transition_id": rows["transition_id"],
                "rollout_id": rows["rollout_id"] if "rollout_id" in rows.column_names else pa.nulls(n, pa.string()),
                "train_table": pa.array([normalize_uri(train_table)] * n, pa.string()),
                "table_version": pa.array([table_version] * n, pa.int64()),
                "consumed_at": pa.array([now] * n, TRAINING_LINEAGE.field("consumed_at").type),
            }
        ).cast(TRAINING_LINEAGE)
        self.lake.write(TABLE, data)
        return n

    def summary(self, model_version: str) -> dict[str, Any]:
        """How many transitions ``model_version`` trained on, from which tables and table versions."""
        rows = self._read(
            ["transition_id", "train_table", "table_version"], pds.field("model_version") == model_version
        )
        versions = sorted({v for v in rows["table_version"].to_pylist() if v is not None})
        return {
            "transitions": rows.num_rows,
            "distinct_transitions": len(pc.unique(rows["transition_id"])) if rows.num_rows else 0,
            "tables": sorted(set(rows["train_table"].to_pylist())),
            "table_versions": versions,
        }

    def credit(self, model_version: str) -> dict[str, dict[str, Any] | None]:
        """Per table ``model_version`` trained on (its URI), the credit settings it recorded at the newest
        version read: which variant, built how (None where the table recorded none)."""
        rows = self._read(["train_table", "table_version"], pds.field("model_version") == model_version)
        out: dict[str, dict[str, Any] | None] = {}
        for uri in sorted(set(rows["train_table"].to_pylist())):
            newest = pc.max(rows.filter(pc.equal(rows["train_table"], uri))["table_version"]).as_py()
            out[uri] = recorded_credit(self.lake, uri, newest)
        return out


def recorded_credit(lake: Lake, table: str, version: int | None = None) -> dict[str, Any] | None:
    """The credit settings of ``table`` (a name such as ``transitions__disc09``, or a table URI) at ``version``.

    The newest commit at or before ``version`` (default: the newest) that recorded its ``CreditSettings``:
    a variant's rebuild, or the pipeline's last `transitions` run. None when no commit recorded them
    (a table written before they were) or the table does not exist.
    """
    uri = lake.uri(table) if base_table(table) is not None else table
    try:
        dt_ = DeltaTable(uri, storage_options=dict(lake.storage_options) or None)
    except TableNotFoundError:
        return None

    def newest_first() -> Iterator[dict[str, Any]]:
        recent = dt_.history(64)  # compaction commits carry none: almost always within these
        yield from recent
        if len(recent) == 64:
            yield from dt_.history()[64:]

    for commit in newest_first():
        if version is not None and commit.get("version", -1) > version:
            continue
        if CREDIT_METADATA_KEY in (commit or {}):
            return json.loads(commit[CREDIT_METADATA_KEY])
    return None
