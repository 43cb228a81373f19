"""One training round, as the CLI (`agentlake train --once`) and the Dagster asset run it.

registry -> which data is new and which version to continue from -> read transitions ->
train -> checkpoint folder -> registry row (pending) -> optionally publish.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.config import Settings
from trainer.checkpoints import load_optimizer_state, save_checkpoint
from trainer.config import TrainConfig, config_from_settings
from trainer.data import TransitionData, latest_version, read_transitions, table_uri
from trainer.errors import TrainerError
from trainer.registry import Registry

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    """What one round did; ``version`` is None when it was skipped (``reason`` says why)."""

    version: str | None
    reason: str = ""
    path: str | None = None
    parent_version: str | None = None
    n_transitions: int = 0
    version_start: int | None = None
    version_end: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)


def pending_transitions(cfg: TrainConfig, registry: Registry) -> tuple[int, int | None]:
    """Where new data starts (exclusive) and the table's newest version (None: no table yet)."""
    if cfg.version_start is not None:
        start = cfg.version_start
    else:
        last = registry.last_trained(table_uri(cfg.lake_root, cfg.table))
        start = last["train_version_end"] if last and last["train_version_end"] is not None else -1
    end = (
        cfg.version_end
        if cfg.version_end is not None
        else latest_version(table_uri(cfg.lake_root, cfg.table), cfg.storage_options)
    )
    return start, end


def read_pending(cfg: TrainConfig, start: int, end: int) -> TransitionData:
    """The config's rows in Delta versions ``(start, end]``: one reader, so the sensor counts what a round trains on."""
    return read_transitions(
        cfg.lake_root,
        table=cfg.table,
        version_start=start,
        version_end=end,
        agent=cfg.agent,
        policy_versions=cfg.policy_versions,
        storage_options=cfg.storage_options,
    )


def train_once(
    settings: Settings | None = None, *, cfg: TrainConfig | None = None, force: bool = False, **overrides: Any
) -> RoundResult:
    """Train one new version on the transitions added since the last one; skip when too few."""
    from trainer.train import train  # torch loads here, not at import

    if cfg is None:
        if settings is None:
            raise TrainerError("train_once needs settings or a TrainConfig")
        cfg = config_from_settings(settings, **overrides)
    elif overrides:
        cfg = cfg.replace(**overrides)
    registry = Registry(cfg.lake_root, cfg.storage_options)
    start, end = pending_transitions(cfg, registry)
    if end is None:
        return RoundResult(None, reason=f"no {cfg.table} table under {cfg.lake_root} yet")
    if end <= start:
        return RoundResult(None, reason=f"no new {cfg.table} versions since {start}", version_start=start)

    data = read_pending(cfg, start, end)
    n = data.rows.num_rows
    if n < cfg.min_new_transitions and not force:
        return RoundResult(
            None,
            reason=f"{n} new transitions, fewer than min_new_transitions={cfg.min_new_transitions}",
            n_transitions=n,
            version_start=start,
            version_end=end,
        )
    if n == 0:
        return RoundResult(None, reason="no transitions match the filters", version_start=start, version_end=end)

    # Continue the policy that generated the data: the serving version, if it is of our kind.
    parent = registry.serving()
    if parent is not None and parent["kind"] != cfg.finetune:
        log.warning(
            "serving %s is %s, not %s: starting from the base model", parent["version"], parent["kind"], cfg.finetune
        )
        parent = None
    parent_path = parent["path"] if parent else None
    optimizer_state = load_optimizer_state(parent_path) if parent_path else None  # resume: AdamW moments
    result = train(cfg, data.rows, parent_path=parent_path, optimizer_state=optimizer_state)

    version, number = registry.next_version()
    meta = {
        "version": version,
        "parent_version": parent["version"] if parent else None,
        "base_model": cfg.base_model,
        "data": {"table": data.table_uri, "version_start": start, "version_end": data.version_end, "rows": n},
        "metrics": result.summary,
        "history": result.history,
    }
    path = save_checkpoint(
        Path(cfg.checkpoint_dir) / version,
        model=result.model,
        tokenizer=result.tokenizer,
        cfg=cfg,
        meta=meta,
        optimizer=result.optimizer,
    )
    registry.add(
        version=version,
        version_number=number,
        parent_version=meta["parent_version"],
        base_model=cfg.base_model,
        kind=cfg.finetune,
        path=str(path),
        served_name=cfg.served_name,
        train_table=data.table_uri,
        train_version_start=start,
        train_version_end=data.version_end,
        n_transitions=n,
        config=cfg.to_dict(),
        metrics=result.summary,
    )
    log.info("trained %s on %d transitions (versions %d..%d) -> %s", version, n, start, data.version_end, path)
    return RoundResult(
        version,
        path=str(path),
        parent_version=meta["parent_version"],
        n_transitions=n,
        version_start=start,
        version_end=data.version_end,
        metrics=result.summary,
        history=result.history,
    )
