"""The asset graph: bronze (Kafka to Delta), silver (trajectories), gold (transitions).

A `policy` asset (the trainer) belongs downstream of ``AssetKey("transitions")`` in a group of its own.
"""

from pipelines.assets.bronze import rewards, spans
from pipelines.assets.gold import transitions
from pipelines.assets.silver import trajectories

BRONZE = "bronze"
SILVER = "silver"
GOLD = "gold"

all_assets = [spans, rewards, trajectories, transitions]

__all__ = ["BRONZE", "GOLD", "SILVER", "all_assets", "rewards", "spans", "trajectories", "transitions"]
