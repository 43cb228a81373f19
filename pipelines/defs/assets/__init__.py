"""The asset graph: bronze (Kafka to Delta), silver (trajectories), gold (transitions), policy."""

from pipelines.defs.assets.bronze import rewards, spans
from pipelines.defs.assets.gold import transitions
from pipelines.defs.assets.policy import policy
from pipelines.defs.assets.reward_functions import reward_functions
from pipelines.defs.assets.silver import trajectories

BRONZE = "bronze"
SILVER = "silver"
GOLD = "gold"

all_assets = [spans, rewards, trajectories, reward_functions, transitions, policy]

__all__ = [
    "BRONZE",
    "GOLD",
    "SILVER",
    "all_assets",
    "policy",
    "reward_functions",
    "rewards",
    "spans",
    "trajectories",
    "transitions",
]
