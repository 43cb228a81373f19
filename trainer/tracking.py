"""The training loop's tracker hook: where an experiment tracker (MLflow, W&B, TensorBoard...) plugs in.

A tracker follows one round (``trainer.round.train_once(..., tracker=...)``): the round gives it its
parameters (the recorded config, the data it reads, the parent version; then the new version's name), the
loop (``trainer.train.train``) gives it every optimizer step's metrics as it computes them (``loss``,
``pg_loss``, ``kl``, ``clip_frac``, ``ratio``, ``adv_mean``, the TIS weights, ``grad_norm``, ``lr``,
``tokens``, ``tokens_per_s``, ``epoch``), and the round closes it at its end, trained, skipped or failed.
In a data-parallel job only rank 0 reports, with the metrics already summed over the ranks.

To add a tracker: write a class with the three methods of ``Tracker`` and ``register_tracker("name",
factory)``; ``make_tracker("name", **options)`` builds one. Built in: ``none`` (reports nowhere) and
``memory`` (keeps what it is given, for a notebook or a test); ``trainer.trackers`` registers ``mlflow``,
``tensorboard`` and ``wandb``. A tracker's failure is its own: the hook does not catch it, so a tracker that
must never stop training catches its errors itself (``trainer.trackers.SafeTracker``). A tracker with a
``url`` attribute (its run's page or folder) gets it recorded in ``model_versions.tracking_url``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from trainer.errors import TrainerError


class Tracker(Protocol):
    """What the round and the loop report to; one tracker per round."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Facts fixed for the round (config values, data range, versions); called once or more, new keys each time."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """One optimizer step's metrics; ``step`` counts from 1 within the round."""

    def close(self) -> None:
        """The round is over; flush and release whatever the tracker holds."""


class NoTracker:
    """Reports nowhere: the loop's default."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryTracker:
    """Keeps every call in memory: ``params`` merged, ``steps`` as (step, metrics) pairs, ``closed``."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update(params)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.steps.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True


_FACTORIES: dict[str, Callable[..., Tracker]] = {"none": NoTracker, "memory": MemoryTracker}


def register_tracker(name: str, factory: Callable[..., Tracker]) -> None:
    """Make ``make_tracker(name, **options)`` call ``factory(**options)``; a name is registered once."""
    if name in _FACTORIES:
        raise TrainerError(f"a tracker named {name!r} is registered already")
    _FACTORIES[name] = factory


def tracker_names() -> list[str]:
    """The names ``make_tracker`` knows, sorted."""
    return sorted(_FACTORIES)


def tracker_url(tracker: Tracker) -> str | None:
    """Where a tracker's run can be seen (``model_versions.tracking_url``): its optional ``url`` attribute."""
    try:
        url = getattr(tracker, "url", None)
    except Exception:  # noqa: BLE001 - a tracker never fails a round
        return None
    return url if isinstance(url, str) and url else None


def make_tracker(name: str, **options: Any) -> Tracker:
    """A new tracker of the kind registered under ``name``; an unknown name is an error that lists the known ones."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        hint = "" if "mlflow" in _FACTORIES else " (import trainer.trackers for mlflow, tensorboard, wandb)"
        raise TrainerError(f"no tracker named {name!r}; known: {', '.join(tracker_names())}{hint}") from None
    return factory(**options)
