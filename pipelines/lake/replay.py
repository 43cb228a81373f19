"""Rebuild every table from Kafka into a fresh lake root: Kafka is the truth, tables are projections.

Except for what was deleted on purpose: the deletions recorded in the source lake (`agentlake forget`,
retention) are applied again, so a rebuild never brings forgotten rows back (``pipelines.lake.forget``).
"""

from __future__ import annotations

import os
from typing import Any

from pipelines.bronze.ingest import ingest
from pipelines.bronze.span_rewards import extract_span_rewards
from pipelines.gold.retokenize import Retokenizer, policy_retokenizer
from pipelines.gold.token_check import policy_verifier
from pipelines.gold.transitions_step import update_transitions
from pipelines.lake.forget import BRONZE, FORGET_TABLES, copy_records, honour, recorded
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import Settings
from schemas.errors import ConfigError
from schemas.lake import Lake


def replay(
    settings: Settings, lake: Lake, *, retokenizer: Retokenizer | None = None, deletions_from: Lake | None = None
) -> dict[str, Any]:
    """Run every step from offset zero (or the earliest retained) into ``lake``, which must be new.

    Calls recorded without token ids are retokenized with the policy's tokenizer, as the
    `transitions` asset does (``retokenizer`` overrides it), so a rebuild equals the incremental lake.

    The deletions recorded in ``deletions_from`` (default: the settings' lake) are applied again:
    forgets to the bronze tables before silver and gold are built from them, then every deletion to
    every table; the deleted files are vacuumed at once and the records copied into ``lake``.
    """
    if "://" not in lake.root and os.path.isdir(lake.root) and os.listdir(lake.root):
        raise ConfigError(f"replay target {lake.root} is not empty; choose a fresh folder")
    for name in ("spans", "rewards", "trajectories", "transitions"):
        if lake.table(name) is not None:
            raise ConfigError(f"replay target already has a {name} table; choose a fresh lake root")
    source = deletions_from or Lake.from_settings(settings)
    deletions = recorded(source) if source.root != lake.root else []
    k = settings.kafka
    out: dict[str, Any] = {
        "spans": ingest(lake, k, "spans", redaction=settings.redaction),
        "rewards": ingest(lake, k, "rewards"),
    }
    forgets = [d for d in deletions if d.kind == "forget"]
    if forgets:
        out["forgotten_bronze"] = honour(lake, forgets, only=BRONZE)
    out["span_rewards"] = extract_span_rewards(lake, k.spans_topic)
    out["trajectories"] = update_trajectories(
        lake, k, idle_timeout_s=settings.credit.idle_timeout_s, reward_name=settings.credit.reward
    )
    tokens = retokenizer or policy_retokenizer(settings)
    out["transitions"] = update_transitions(
        lake, settings.credit, retokenizer=tokens, verifier=policy_verifier(settings)
    )
    if deletions:
        out["forgotten"] = honour(lake, deletions)
        _vacuum_all(lake)
        out["deletions"] = copy_records(source, lake)
    return out


def _vacuum_all(lake: Lake) -> None:
    """Remove every file the re-applied deletions left (the new lake has no readers of older snapshots)."""
    for name in FORGET_TABLES:
        lake.vacuum(name, retention_hours=0)
