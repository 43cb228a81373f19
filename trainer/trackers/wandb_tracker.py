"""A Weights & Biases run per round, offline: files under ``<root>/wandb`` (``wandb sync`` uploads them later).

Offline mode needs no account or network, so it is what runs here and in tests; the run's folder
(``offline-run-<time>-<id>``) holds its config, history and events.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class WandbTracker:
    def __init__(self, *, root: str, experiment: str = "agentlake", run_name: str = "round") -> None:
        import wandb

        folder = Path(root).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=experiment,
            name=run_name,
            dir=str(folder),
            mode="offline",
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.url = Path(self.run.dir).parent.as_uri()  # the offline run's folder (files/ is its dir)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() returns before W&B's service has written the run's log (measured: a 7-byte file, its
        # header only); teardown stops the service, which flushes it, so the files are whole at close.
        wandb.teardown()
