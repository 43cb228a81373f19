"""TensorBoard event files per round (``torch.utils.tensorboard``, which needs the ``tensorboard`` package).

Scalars go under their metric names at each optimizer step; the parameters, as one JSON text
(``params``), at step 0. The run folder is ``<root>/tensorboard/<run name>``: point ``tensorboard
--logdir <root>/tensorboard`` at it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TensorBoardTracker:
    def __init__(self, *, root: str, experiment: str = "agentlake", run_name: str = "round") -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(root).expanduser().resolve() / "tensorboard" / experiment / run_name
        self.writer = SummaryWriter(log_dir=str(self.folder))
        self.url = self.folder.as_uri()
        self.params: dict[str, Any] = {}

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update(params)
        self.writer.add_text("params", json.dumps(self.params, sort_keys=True, default=str), 0)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), step)

    def close(self) -> None:
        self.writer.close()
