"""Rebuild every table from Kafka into a fresh lake root: Kafka is the truth, tables are projections."""

from __future__ import annotations

import os
from typing import Any

from pipelines.ingest import extract_span_rewards, ingest
from pipelines.lake import Lake
from pipelines.retokenize import Retokenizer, policy_retokenizer
from pipelines.steps import update_trajectories, update_transitions
from schemas.config import Settings
from schemas.errors import ConfigError


def replay(settings: Settings, lake: Lake, *, retokenizer: Retokenizer | None = None) -> dict[str, Any]:
    """Run every step from offset zero (or the earliest retained) into ``lake``, which must be new.

    Calls recorded without token ids are retokenized with the policy's tokenizer, as the
    `transitions` asset does (``retokenizer`` overrides it), so a rebuild equals the incremental lake.
    """
    if "://" not in lake.root and os.path.isdir(lake.root) and os.listdir(lake.root):
        raise ConfigError(f"replay target {lake.root} is not empty; choose a fresh folder")
    for name in ("spans", "rewards", "trajectories", "transitions"):
        if lake.table(name) is not None:
            raise ConfigError(f"replay target already has a {name} table; choose a fresh lake root")
    k = settings.kafka
    out: dict[str, Any] = {
        "spans": ingest(lake, k, "spans"),
        "rewards": ingest(lake, k, "rewards"),
        "span_rewards": extract_span_rewards(lake, k.spans_topic),
    }
    out["trajectories"] = update_trajectories(lake, k, idle_timeout_s=settings.credit.idle_timeout_s)
    tokens = retokenizer or policy_retokenizer(settings)
    out["transitions"] = update_transitions(lake, settings.credit, retokenizer=tokens)
    return out
