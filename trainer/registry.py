"""The model registry: the ``model_versions`` Delta table (schema ``schemas.tables.MODEL_VERSIONS``).

One row per version: parent, base model, checkpoint path, where its files are stored in the lake
and the hash of their manifest (``trainer.artifacts``), the transitions table and Delta version
range it trained on, config and metrics as JSON, and its publish status. A status
change is a MERGE, i.e. a new Delta version, so the table's history keeps every state a
version went through (``DeltaTable.history()`` / time travel). Lineage in DuckDB:

    SELECT version, parent_version, train_version_start, train_version_end, publish_status
    FROM delta_scan('<lake>/model_versions') ORDER BY version_number;

Which transitions each version trained on is in ``training_lineage`` (``trainer.lineage``).

The schema grows by nullable columns (v2 added ``artifact_uri`` and ``manifest_sha256``): every write
evolves an older table's schema (``Lake.insert_new`` merges it, as ``Lake.write`` does), and rows
read from it carry every current column, None where an old row has none. Every read and write goes
through the lake layer (``schemas.lake.Lake``), as the pipeline's do.

Policy lines (v3, ``agent``): with ``trainer.agents`` set, each listed agent's versions form a line of
their own (``trainer.lines``), served under their own name; ``serving`` and ``last_trained`` answer for
one line (``agent=None``: the single policy, every row of a table written before v3). Version names
stay one sequence across lines, so a name is still a key and a folder name.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Literal

import pyarrow as pa

from schemas.lake import Lake
from schemas.tables import MODEL_VERSIONS
from schemas.uris import normalize_uri, same_location
from trainer.errors import RegistryError

TABLE = "model_versions"
Status = Literal["pending", "published", "failed", "rejected", "rolled_back"]
STATUSES: tuple[str, ...] = ("pending", "published", "failed", "rejected", "rolled_back")


_ABSENT: dict[str, Any] = dict.fromkeys(MODEL_VERSIONS.names)  # columns an older table lacks read as None


def version_name(number: int) -> str:
    return f"v{number:04d}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Registry:
    """Read and append ``model_versions`` rows of one lake."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.uri = lake.uri(TABLE)

    def rows(self) -> list[dict[str, Any]]:
        """Every version, oldest first."""
        table = self.lake.table(TABLE)
        if table is None:
            return []
        rows = [{**_ABSENT, **r} for r in table.to_pyarrow_table().to_pylist()]
        return sorted(rows, key=lambda r: r["version_number"])

    def get(self, version: str) -> dict[str, Any]:
        for row in self.rows():
            if row["version"] == version:
                return row
        raise RegistryError(f"no model version {version!r} in {self.uri}; `agentlake model list` shows them")

    def next_version(self) -> tuple[str, int]:
        rows = self.rows()
        number = (rows[-1]["version_number"] if rows else 0) + 1
        return version_name(number), number

    def serving(self, agent: str | None = None) -> dict[str, Any] | None:
        """The version vLLM serves now for ``agent``'s line (None: the single policy): the most recently
        published one of that line still marked published."""
        live = [
            r
            for r in self.rows()
            if r["publish_status"] == "published" and r["published_at"] is not None and r["agent"] == agent
        ]
        return max(live, key=lambda r: r["published_at"]) if live else None

    def last_trained(self, train_table: str | None = None, agent: str | None = None) -> dict[str, Any] | None:
        """The newest version (any status) of ``agent``'s line trained on ``train_table`` (any spelling of it)."""
        rows = [
            r
            for r in self.rows()
            if r["agent"] == agent and (train_table is None or same_location(r["train_table"], train_table))
        ]
        return rows[-1] if rows else None

    def line_versions(self, agent: str | None = None) -> list[str]:
        """The versions of ``agent``'s line (None: the single policy), oldest first, whatever their status:
        what a row's staleness counts within a line (``trainer.offpolicy``)."""
        return [r["version"] for r in self.rows() if r["agent"] == agent]

    def lineage(self, version: str) -> list[dict[str, Any]]:
        """``version`` and its ancestors, newest first."""
        by_name = {r["version"]: r for r in self.rows()}
        if version not in by_name:
            raise RegistryError(f"no model version {version!r} in {self.uri}")
        chain: list[dict[str, Any]] = []
        name: str | None = version
        while name is not None and name in by_name and len(chain) <= len(by_name):
            chain.append(by_name[name])
            name = by_name[name]["parent_version"]
        return chain

    def add(
        self,
        *,
        version: str,
        version_number: int,
        base_model: str,
        kind: Literal["lora", "full"],
        path: str,
        parent_version: str | None = None,
        served_name: str | None = None,
        train_table: str | None = None,
        train_version_start: int | None = None,
        train_version_end: int | None = None,
        n_transitions: int | None = None,
        config: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        artifact_uri: str | None = None,
        manifest_sha256: str | None = None,
        agent: str | None = None,
        tracking_url: str | None = None,
    ) -> dict[str, Any]:
        """Insert a new version as ``pending`` in ``agent``'s line; a version name already taken is an error."""
        row = {
            "version": version,
            "version_number": version_number,
            "parent_version": parent_version,
            "base_model": base_model,
            "kind": kind,
            "path": path,
            "served_name": served_name,
            "train_table": normalize_uri(train_table) if train_table else train_table,
            "train_version_start": train_version_start,
            "train_version_end": train_version_end,
            "n_transitions": n_transitions,
            "config": json.dumps(config or {}, sort_keys=True, default=str),
            "metrics": json.dumps(metrics or {}, sort_keys=True, default=str),
            "publish_status": "pending",
            "publish_error": None,
            "created_at": _now(),
            "published_at": None,
            "artifact_uri": artifact_uri,
            "manifest_sha256": manifest_sha256,
            "agent": agent,
            "tracking_url": tracking_url,
        }
        # MERGE ... WHEN NOT MATCHED INSERT: two trainers racing for one name cannot both win.
        if self.lake.insert_new(TABLE, pa.Table.from_pylist([row], schema=MODEL_VERSIONS), key="version") != 1:
            raise RegistryError(f"model version {version} already exists in {self.uri}")
        return row

    def set_status(
        self,
        version: str,
        status: Status,
        *,
        error: str | None = None,
        published_at: dt.datetime | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Record a publish outcome as a new table version; ``published_at`` is kept unless given."""
        if status not in STATUSES:
            raise RegistryError(f"publish status must be one of {', '.join(STATUSES)}, got {status!r}")
        fields = [
            pa.field("version", pa.string()),
            pa.field("publish_status", pa.string()),
            pa.field("publish_error", pa.string()),
            pa.field("published_at", MODEL_VERSIONS.field("published_at").type),
            pa.field("metrics", pa.string()),
        ]
        updates = {"publish_status": "s.publish_status", "publish_error": "s.publish_error"}
        if published_at is not None:
            updates["published_at"] = "s.published_at"
        merged_metrics = None
        if metrics is not None:
            merged_metrics = json.dumps({**json.loads(self.get(version)["metrics"] or "{}"), **metrics}, default=str)
            updates["metrics"] = "s.metrics"
        source = pa.Table.from_pylist(
            [
                {
                    "version": version,
                    "publish_status": status,
                    "publish_error": error,
                    "published_at": published_at,
                    "metrics": merged_metrics,
                }
            ],
            schema=pa.schema(fields),
        )
        updated = self.lake.update(TABLE, source, key="version", columns=updates)
        if updated is None:
            raise RegistryError(f"no model registry at {self.uri}; train a version first")
        if updated != 1:
            raise RegistryError(f"no model version {version!r} in {self.uri}")
