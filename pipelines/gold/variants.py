"""Credit variants: `transitions` built again from the same trajectories under other credit settings.

Trying another credit assignment (``discounted`` with gamma 0.9, RLOO instead of GRPO) needs no new
rollouts: the trajectories hold everything credit is computed from. A variant is a table of its own,
``transitions__<name>`` (``schemas.tables.transitions_variant``), with the `transitions` schema, built
by the same ``pipelines.gold.transitions.build`` from every trajectory at one pinned `trajectories` version
and written in one overwrite commit: rebuilding it (with the same or other settings) is a new Delta
version of it, never a change to `transitions`, which the incremental pipeline owns.

Each commit records its ``CreditSettings`` (``schemas.tables.CREDIT_METADATA_KEY``) and the
`trajectories` version it read, so ``trainer.lineage.recorded_credit`` tells what a model version
trained on. Group advantages (GRPO, RLOO) are recomputed over the groups as they are now; a running
baseline starts fresh and advances over every rollout in the order ``build`` counts them (when each
reward became known), in one ``build`` over all groups since chunks would reorder them: what a lake
replayed at once computes, not a continuation of the baseline saved in `transitions`.

Transition ids are the same in every variant (rollout, attempt, step): the trainer counts what it
consumed per table, so training on a variant leaves the main table's rows pending, and a variant
rebuilt under the same name keeps the ids trained on (`agentlake train --from-version` trains again).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from pipelines import keys
from pipelines.errors import VariantError
from pipelines.gold.estimators import is_stateful
from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.transitions import build
from pipelines.gold.transitions_step import BASELINE_KEY
from pipelines.steps import group_chunks
from schemas.config import CreditSettings
from schemas.lake import Lake
from schemas.storage import filesystem
from schemas.tables import CREDIT_METADATA_KEY, TRANSITIONS, VARIANT_SEPARATOR, base_table, transitions_variant

MAIN_NAMES = ("main", "transitions")  # names that would mean the pipeline's own table
TRAJECTORIES_VERSION_KEY = "agentlake.trajectories_version"  # variant commit metadata: the version it read


class VariantInfo(TypedDict):
    """What ``describe`` tells of a built variant."""

    table: str
    version: int
    built_at_version: int | None
    rows: int
    credit: dict[str, Any]
    trajectories_version: int


@dataclass
class VariantResult:
    """What one rebuild wrote: the table, its new version and what went in."""

    table: str
    version: int
    rows: int
    rollouts: int
    trajectories_version: int
    credit: CreditSettings
    dropped: dict[str, int] = field(default_factory=dict)


def default_name(credit: CreditSettings) -> str:
    """A variant name spelled from the settings that change credit most: ``discounted_g0p9_rloo``."""
    parts: list[str] = [credit.mode]
    if credit.mode in ("discounted", "per_step"):  # gamma means nothing to the other modes
        parts.append("g" + f"{credit.gamma:g}".replace(".", "p"))
    parts.append(credit.advantage)
    if credit.advantage == "grpo" and not credit.normalize_std:
        parts.append("nostd")
    if credit.merge_calls:
        parts.append("merged")
    return "_".join(parts).replace("-", "")


def variant_table(name: str) -> str:
    """The table of variant ``name``; refuses the main table's names and bad spellings (``VariantError``)."""
    if name in MAIN_NAMES:
        raise VariantError(
            "`transitions` is written by the incremental pipeline (the gold asset): a rebuild there would race it. "
            "Pick another --name for a variant, or change [credit] in agentlake.toml and replay the lake"
        )
    try:
        return transitions_variant(name)
    except ValueError as exc:
        raise VariantError(str(exc)) from None


def rebuild_variant(
    lake: Lake,
    credit: CreditSettings,
    *,
    name: str | None = None,
    retokenizer: Retokenizer | Callable[[], Retokenizer | None] | None = None,
    verifier: Callable[[Any, Any], list[int] | None] | None = None,
    now: dt.datetime | None = None,
    chunk_rollouts: int = 10_000,
) -> VariantResult:
    """Write ``transitions__<name>`` from every current trajectory under ``credit``; one new version.

    Groups are built ``chunk_rollouts`` trajectories at a time (all at once for a running baseline),
    and the result lands in one overwrite commit, so a reader sees the old variant or the new one.
    """
    table = variant_table(name or default_name(credit))
    now = now or dt.datetime.now(dt.UTC)
    source = lake.table("trajectories")
    if source is None:
        raise VariantError(f"no trajectories table under {lake.root} yet: run the pipeline first")
    traj = pl.scan_delta(source)  # one snapshot for the whole rebuild
    group = pl.coalesce("task_id", "rollout_id").alias("group_id")
    sizes = traj.group_by("tenant", group).len().sort(keys.GROUP).collect()
    groups = list(sizes.select(keys.GROUP).iter_rows())
    if is_stateful(credit.advantage):
        chunks = [groups] if groups else []
    else:
        chunks = group_chunks(groups, sizes["len"].to_list(), chunk_rollouts)
    parts: list[pa.Table] = []
    dropped: dict[str, int] = {}
    rollouts = 0
    baseline = None
    for chunk in chunks:
        picked = traj.filter(pl.col("tenant").is_in(sorted({t for t, _ in chunk})) & group.is_in([g for _, g in chunk]))
        rows = keys.keep(picked.with_columns(group).collect(engine="streaming"), chunk, "group_id").drop("group_id")
        out = build(rows, credit, now=now, retokenizer=retokenizer, verifier=verifier)
        parts.append(out.table)
        rollouts += out.rollouts
        baseline = out.baseline or baseline
        for reason, n in out.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    data = pa.concat_tables(parts) if parts else TRANSITIONS.empty_table()
    metadata = {
        CREDIT_METADATA_KEY: credit.model_dump_json(),
        TRAJECTORIES_VERSION_KEY: str(source.version()),
        **({BASELINE_KEY: baseline.to_json()} if baseline is not None else {}),
    }
    version = lake.write(table, data, mode="overwrite", metadata=metadata)
    return VariantResult(
        table=table,
        version=version,
        rows=data.num_rows,
        rollouts=rollouts,
        trajectories_version=source.version(),
        credit=credit,
        dropped=dropped,
    )


def variant_names(lake: Lake) -> list[str]:
    """The variants built in ``lake`` (their names, sorted): the folders ``transitions__<name>`` holding a Delta log.

    Listed from storage, so every copy of transition rows is found (what `agentlake forget` must reach too).
    """
    fs, root = filesystem(lake.root, lake.storage_options)
    try:
        entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except FileNotFoundError:
        return []
    prefix = f"transitions{VARIANT_SEPARATOR}"
    names = []
    for entry in entries:
        if entry.type == pafs.FileType.Directory and base_table(entry.base_name) == "transitions":
            if entry.base_name.startswith(prefix) and lake.table(entry.base_name) is not None:
                names.append(entry.base_name.removeprefix(prefix))
    return sorted(names)


def describe(lake: Lake, name: str) -> VariantInfo | None:
    """A variant's newest version, rows, credit settings and source `trajectories` version (None: not built)."""
    table = variant_table(name)
    dt_ = lake.table(table)
    if dt_ is None:
        return None
    for commit in dt_.history():
        if CREDIT_METADATA_KEY in (commit or {}):
            return {
                "table": table,
                "version": dt_.version(),
                "built_at_version": commit.get("version"),
                "rows": pl.scan_delta(dt_).select(pl.len()).collect().item(),
                "credit": json.loads(commit[CREDIT_METADATA_KEY]),
                "trajectories_version": int(commit.get(TRAJECTORIES_VERSION_KEY, -1)),
            }
    return None
