"""The asset graph: bronze (Kafka to Delta), silver (trajectories), gold (transitions), policy."""

from pipelines.assets.bronze import rewards, spans
from pipelines.assets.gold import transitions
from pipelines.assets.policy import policy
from pipelines.assets.silver import trajectories

BRONZE = "bronze"
SILVER = "silver"
GOLD = "gold"

all_assets = [spans, rewards, trajectories, transitions, policy]

__all__ = ["BRONZE", "GOLD", "SILVER", "all_assets", "policy", "rewards", "spans", "trajectories", "transitions"]
