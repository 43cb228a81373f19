"""Training lineage: the ``training_lineage`` Delta table (schema ``schemas.tables.TRAINING_LINEAGE``).

One row per (model version, transition it trained on), with the transitions table it came from
and the Delta version it was read at. It is what makes consumption exact: the next round's data
is ``transitions`` (at one pinned version) anti-joined with this table on ``transition_id``, so
compaction, vacuum and group rewrites, which move rows into new files without changing their ids,
never make old rows look new. In DuckDB (``agentlake query``):

    SELECT m.version, count(*) AS transitions, min(l.table_version), max(l.table_version)
    FROM model_versions m JOIN training_lineage l ON l.model_version = m.version
    JOIN transitions t USING (transition_id)
    GROUP BY 1 ORDER BY 1;
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from schemas.lake import Lake
from schemas.tables import TRAINING_LINEAGE
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

    def consumed_ids(self, train_table: str) -> pa.Array:
        """Every transition id of ``train_table`` that some model version already trained on."""
        ids = self._read(["transition_id"], pds.field("train_table") == normalize_uri(train_table))
        return pc.unique(ids["transition_id"]) if ids.num_rows else pa.array([], pa.string())

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
