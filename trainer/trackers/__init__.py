"""The experiment trackers behind ``trainer.tracking``'s seam: MLflow, TensorBoard, W&B (offline).

Each lives in its own module and imports its package only when a tracker is made, so the light SDK
install and a trainer without the package still import this. Every tracker made here is wrapped in
``SafeTracker``: a tracker never fails a round. Its first error (a package missing, a server that does
not answer, a rejected value) is one logged warning, after which it reports nowhere; the round's
metrics stay in ``model_versions`` either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from trainer.tracking import NoTracker, Tracker, register_tracker, tracker_names, tracker_url

log = logging.getLogger(__name__)


class SafeTracker:
    """A tracker whose errors are warnings: after its first one it reports nowhere (``error`` says why)."""

    def __init__(self, name: str, make: Callable[[], Tracker]) -> None:
        self.name = name
        self.error = ""
        self.inner: Tracker | None = None
        try:
            self.inner = make()
        except Exception as exc:  # noqa: BLE001 - a tracker never fails a round
            self._fail("start", exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ImportError):
            self.error += " (pip install 'agentlake[trackers]')"
        self.inner = None
        log.warning(
            "the %s tracker failed to %s (%s): it reports nothing more this round; "
            "the round's metrics are still recorded in model_versions",
            self.name,
            what,
            self.error,
        )

    def _call(self, what: str, fn: Callable[[Tracker], None]) -> None:
        if self.inner is None:
            return
        try:
            fn(self.inner)
        except Exception as exc:  # noqa: BLE001 - a tracker never fails a round
            self._fail(what, exc)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._call("log parameters", lambda t: t.log_params(params))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._call(f"log step {step}", lambda t: t.log_metrics(step, metrics))

    def close(self) -> None:
        self._call("close its run", lambda t: t.close())

    @property
    def url(self) -> str | None:
        """Where the run can be seen (an MLflow run's page, a TensorBoard or W&B run folder), once it started."""
        return tracker_url(self.inner) if self.inner is not None else None


def run_name(line: str | None = None) -> str:
    """A round's run name before its version is known: the time it started (and the policy line)."""
    return time.strftime("round-%Y%m%d-%H%M%S") + (f"-{line}" if line else "")


def _mlflow(**options: Any) -> Tracker:
    def make() -> Tracker:
        from trainer.trackers.mlflow_tracker import MlflowTracker

        return MlflowTracker(**options)

    return SafeTracker("mlflow", make)


def _tensorboard(**options: Any) -> Tracker:
    def make() -> Tracker:
        from trainer.trackers.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(**options)

    return SafeTracker("tensorboard", make)


def _wandb(**options: Any) -> Tracker:
    def make() -> Tracker:
        from trainer.trackers.wandb_tracker import WandbTracker

        return WandbTracker(**options)

    return SafeTracker("wandb", make)


for _name, _factory in (("mlflow", _mlflow), ("tensorboard", _tensorboard), ("wandb", _wandb)):
    if _name not in tracker_names():
        register_tracker(_name, _factory)


def tracker_for(settings: Any, *, line: str | None = None) -> Tracker:
    """The tracker ``settings.tracking`` chooses for one round (``trainer.round.train_once``'s default).

    ``auto``: MLflow when a tracking URI is known (``tracking.uri``, or the running stack's server), else none."""
    t = settings.tracking
    name = t.tracker
    if name == "auto":
        name = "mlflow" if t.uri else "none"
    if name == "none":
        return NoTracker()
    from trainer.tracking import make_tracker

    if name == "mlflow":
        if not t.uri:
            log.warning("tracking.tracker = mlflow but no tracking.uri, and no running stack's MLflow server")
            return NoTracker()
        return make_tracker("mlflow", uri=t.uri, experiment=t.experiment, run_name=run_name(line))
    return make_tracker(name, root=str(t.dir), experiment=t.experiment, run_name=run_name(line))


def log_eval(tracking_url: str | None, scores: Mapping[str, float], *, prefix: str = "eval_") -> bool:
    """Add a version's eval scores to the MLflow run that trained it (its page's URL, as in
    ``model_versions.tracking_url``); True when logged. Other trackers' runs are closed files: skipped.
    Like every tracker call, a failure is a warning."""
    if not tracking_url or not scores or "/#/experiments/" not in tracking_url:
        return False
    uri, _, rest = tracking_url.partition("/#/experiments/")
    run_id = rest.rsplit("/runs/", 1)[-1]
    try:
        from trainer.trackers.mlflow_tracker import log_to_run, server_answers

        if not server_answers(uri):
            raise ConnectionError(f"no MLflow tracking server answers at {uri}")
        log_to_run(uri, run_id, {f"{prefix}{k}": float(v) for k, v in scores.items()})
        return True
    except Exception as exc:  # noqa: BLE001 - tracking never fails a round or its publish
        log.warning("could not add eval scores to MLflow run %s (%s: %s)", run_id, type(exc).__name__, exc)
        return False
