"""Partition a gold table by day (as shipped) or by (tenant, day)? What each costs, measured.

    .venv/bin/python benchmarks/bench_tenant_partitioning.py [--tenants 4,20] [--commits 200] [--rows 40]

Writes a transitions-like table (token lists of 200 ids) the way the pipeline does: many small
commits (one per asset run), each holding rows of every tenant, over two days. Then reads it whole
and for one tenant, deletes one tenant (``DeltaTable.delete("tenant = 't1'")``, what forgetting a
tenant does), and compacts and deletes again (the maintenance job compacts). Prints one row per
(tenants, partitioning).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake


def batch(i: int, *, tenants: int, rows: int, commits: int, rng: np.random.Generator) -> pa.Table:
    tokens = [rng.integers(0, 50_000, 200).astype(np.int32).tolist() for _ in range(rows)]
    return pa.table(
        {
            "transition_id": [f"r{i}-{k}" for k in range(rows)],
            "tenant": [f"t{k % tenants}" for k in range(rows)],
            "day": [dt.date(2030, 1, 1 + (2 * i) // commits)] * rows,
            "prompt_ids": pa.array(tokens, pa.list_(pa.int32())),
            "reward": rng.random(rows),
        }
    )


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(root: Path, parts: list[str], *, tenants: int, commits: int, rows: int) -> dict[str, object]:
    path = root / "_".join(parts)
    rng = np.random.default_rng(0)
    write_s, _ = timed(
        lambda: [
            write_deltalake(
                str(path),
                batch(i, tenants=tenants, rows=rows, commits=commits, rng=rng),
                mode="append",
                partition_by=parts,
            )
            for i in range(commits)
        ]
    )
    out: dict[str, object] = {"write_s": write_s, "files": len(DeltaTable(str(path)).file_uris())}
    out["read_s"], _ = timed(lambda: pl.read_delta(str(path)).height)
    out["read_tenant_s"], _ = timed(lambda: pl.scan_delta(str(path)).filter(pl.col("tenant") == "t1").collect())
    for compacted in (False, True):
        copy = root / f"{path.name}-{compacted}"
        shutil.copytree(path, copy)
        table = DeltaTable(str(copy))
        if compacted:
            out["compact_s"], _ = timed(lambda t=table: t.optimize.compact())
            table = DeltaTable(str(copy))
        seconds, metrics = timed(lambda t=table: t.delete("tenant = 't1'"))
        label = "delete_compacted" if compacted else "delete"
        out[f"{label}_s"] = seconds
        out[f"{label}_rows_rewritten"] = metrics.get("num_copied_rows")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", default="4,20")
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--rows", type=int, default=40)
    args = ap.parse_args()
    cols = ["write_s", "files", "read_s", "read_tenant_s", "delete_s", "delete_rows_rewritten", "compact_s"]
    cols += ["delete_compacted_s", "delete_compacted_rows_rewritten"]
    print("| tenants | partition_by | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for n in (int(x) for x in args.tenants.split(",")):
        for parts in (["day"], ["tenant", "day"]):
            with tempfile.TemporaryDirectory() as tmp:
                got = measure(Path(tmp), parts, tenants=n, commits=args.commits, rows=args.rows)
            cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in (got[c] for c in cols)]
            print(f"| {n} | {','.join(parts)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
