"""``[tracking]``: which experiment tracker follows each training round, and the stack's MLflow server.

``tracker = "auto"`` (the default) is ``mlflow`` when a tracking URI is known (set here, or the running
stack's MLflow server, recorded in its stack file) and ``none`` otherwise; ``tensorboard`` and ``wandb``
(offline) write under ``dir``. A tracker never fails a round (``trainer.trackers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from schemas.config.base import Section

TrackerName = Literal["auto", "none", "mlflow", "tensorboard", "wandb"]


class TrackingSettings(Section):
    tracker: TrackerName = "auto"
    # MLflow's tracking server (http://host:port); empty: the local stack's, once `agentlake up` started one.
    uri: str = ""
    experiment: str = "agentlake"  # the MLflow experiment / W&B project each round's run goes in
    dir: Path = Path(".agentlake/runs")  # TensorBoard's and W&B's offline run folders
    # The local stack runs `mlflow server` (backend on its PostgreSQL, artifacts in its object store).
    server: bool = True
    host: str = "127.0.0.1"
    port: int = Field(5000, ge=0, le=65535)  # the stack's MLflow server; 0: a free one
