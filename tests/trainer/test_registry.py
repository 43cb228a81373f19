"""The model_versions table: rows, status history, lineage (in DuckDB too), and a full round."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from schemas.lake import Lake
from schemas.tables import MODEL_VERSIONS
from tests.trainer.helpers import transition, write_transitions
from trainer.config import TrainConfig
from trainer.errors import RegistryError
from trainer.registry import Registry
from trainer.round import train_once


def _duckdb():
    import duckdb
    import duckdb_extension_delta

    ext = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    return con


def _add(reg: Registry, n: int, parent: str | None, start: int, end: int) -> str:
    version, number = reg.next_version()
    assert number == n
    reg.add(
        version=version,
        version_number=number,
        parent_version=parent,
        base_model="tiny",
        kind="lora",
        path=f"/models/{version}",
        served_name="policy",
        train_table="lake/transitions",
        train_version_start=start,
        train_version_end=end,
        n_transitions=10 * n,
        config={"learning_rate": 1e-4},
        metrics={"final_loss": -0.1 * n},
    )
    return version


def test_rows_status_history_and_lineage(lake: Path) -> None:
    reg = Registry(Lake(str(lake)))
    assert reg.rows() == [] and reg.serving() is None
    v1 = _add(reg, 1, None, -1, 3)
    v2 = _add(reg, 2, v1, 3, 7)
    v3 = _add(reg, 3, v2, 7, 9)
    assert (v1, v2, v3) == ("v0001", "v0002", "v0003")
    with pytest.raises(RegistryError, match="already exists"):
        reg.add(version=v2, version_number=2, base_model="tiny", kind="lora", path="/x")

    import datetime as dt

    t = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    reg.set_status(v1, "published", published_at=t)
    reg.set_status(v2, "published", published_at=t + dt.timedelta(hours=1), metrics={"publish_seconds": 0.5})
    reg.set_status(v3, "failed", error="vLLM answered 500")
    assert reg.serving()["version"] == v2
    assert json.loads(reg.get(v2)["metrics"]) == {"final_loss": -0.2, "publish_seconds": 0.5}
    assert reg.get(v3)["publish_error"] == "vLLM answered 500"
    assert [r["version"] for r in reg.lineage(v3)] == [v3, v2, v1]
    with pytest.raises(RegistryError, match="no model version"):
        reg.set_status("v0042", "published")

    # Each status change is a Delta version of its own: the history keeps v0003's "pending" state.
    table = DeltaTable(reg.uri)
    assert table.version() == 5  # versions 0-2: adds; 3-5: status changes (no-op merges commit nothing)
    before = DeltaTable(reg.uri, version=4).to_pyarrow_table().to_pylist()
    assert {r["version"]: r["publish_status"] for r in before}[v3] == "pending"
    assert table.to_pyarrow_table().schema.names == MODEL_VERSIONS.names

    lineage = (
        _duckdb()
        .execute(
            f"""
        WITH RECURSIVE chain AS (
            SELECT version, parent_version, train_version_start, train_version_end
            FROM delta_scan('{reg.uri}') WHERE version = 'v0003'
            UNION ALL
            SELECT m.version, m.parent_version, m.train_version_start, m.train_version_end
            FROM delta_scan('{reg.uri}') m JOIN chain c ON m.version = c.parent_version
        )
        SELECT * FROM chain ORDER BY version
        """
        )
        .fetchall()
    )
    assert lineage == [("v0001", None, -1, 3), ("v0002", "v0001", 3, 7), ("v0003", "v0002", 7, 9)]


def test_train_once_trains_new_data_then_waits_for_more(lake: Path, tiny_model_dir: Path) -> None:
    from tests.trainer.helpers import build_tokenizer

    tok = build_tokenizer()
    prompt, good, bad = (
        tok("what is two plus three")["input_ids"],
        tok("good yes")["input_ids"],
        tok("bad")["input_ids"],
    )
    rows = [transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(8)]
    cfg = TrainConfig(
        lake_root=str(lake),
        base_model=str(tiny_model_dir),
        checkpoint_dir=str(lake / "models"),
        min_new_transitions=4,
        lora_rank=4,
        batch_size=4,
        epochs=1,
        progress=False,
    )
    assert train_once(cfg=cfg).reason.startswith("no transitions table")
    end = write_transitions(lake, rows)

    first = train_once(cfg=cfg)
    assert first.version == "v0001" and first.n_transitions == 8
    assert (first.version_start, first.version_end) == (-1, end)
    assert (Path(first.path) / "adapter_model.safetensors").exists()
    row = Registry(Lake(str(lake))).get("v0001")
    # A local lake: the checkpoint folder under <lake>/models is the stored artifact (no second copy).
    assert row["artifact_uri"] == first.path == str(lake / "models" / "v0001")
    assert row["manifest_sha256"] == hashlib.sha256((Path(first.path) / "manifest.json").read_bytes()).hexdigest()
    assert [p.name for p in (lake / "models").iterdir()] == ["v0001"]
    assert row["publish_status"] == "pending" and row["train_version_end"] == end
    assert json.loads(row["config"])["lora_rank"] == 4 and "final_loss" in json.loads(row["metrics"])

    assert train_once(cfg=cfg).reason.startswith("no new transitions: every transitions row at version 0")
    write_transitions(lake, rows[:2])  # the same transitions again (a duplicate write): nothing new
    assert train_once(cfg=cfg, force=True).version is None
    write_transitions(lake, [{**r, "transition_id": f"new{i}"} for i, r in enumerate(rows[:2])])
    skipped = train_once(cfg=cfg)
    assert skipped.version is None and "fewer than min_new_transitions=4" in skipped.reason
    forced = train_once(cfg=cfg, force=True)
    assert forced.version == "v0002" and forced.n_transitions == 2 and forced.version_start == end
    assert forced.version_end == end + 2


def test_an_older_table_gains_the_new_columns_on_its_next_write(lake: Path) -> None:
    """A registry written with schema v1 (no artifact columns) takes a v2 row; old rows read None."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    v1 = pa.schema([f for f in MODEL_VERSIONS if f.name not in ("artifact_uri", "manifest_sha256")])
    now = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    old = {n: None for n in v1.names} | {
        "version": "v0001",
        "version_number": 1,
        "base_model": "tiny",
        "kind": "lora",
        "path": "/models/v0001",
        "publish_status": "published",
        "created_at": now,
        "published_at": now,
    }
    reg = Registry(Lake(str(lake)))
    write_deltalake(reg.uri, pa.Table.from_pylist([old], schema=v1))
    assert reg.get("v0001")["artifact_uri"] is None and reg.serving()["version"] == "v0001"

    reg.add(
        version="v0002",
        version_number=2,
        parent_version="v0001",
        base_model="tiny",
        kind="lora",
        path="/models/v0002",
        artifact_uri="s3://bucket/lake/models/v0002/0123456789abcdef",
        manifest_sha256="0123456789abcdef" * 4,
    )
    reg.set_status("v0002", "published", published_at=now + dt.timedelta(hours=1))
    assert sorted(DeltaTable(reg.uri).schema().to_arrow().names) == sorted(MODEL_VERSIONS.names)
    rows = {r["version"]: r for r in reg.rows()}
    assert rows["v0001"]["artifact_uri"] is None and rows["v0001"]["manifest_sha256"] is None
    assert rows["v0002"]["artifact_uri"].endswith("/v0002/0123456789abcdef")
    assert reg.serving()["version"] == "v0002"
