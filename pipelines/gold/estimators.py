"""Advantage estimators, by name: where a new one plugs in.

An estimator gets one row per rollout (``_attempt``, ``rollout_id``, ``tenant``, ``group_id``,
``score``, ``_order``, ``_agent``, ``_default``) and adds ``_b`` (the baseline the score is
compared with) and ``_s`` (the scale it is divided by); `pipelines.gold.credit.advantages` then
broadcasts ``(score - _b) / _s`` to the calls. Groups (``group``: tenant and task) never span tenants.

Adding one is a function and a registration::

    @register("median")
    def median(rollouts: pl.DataFrame, group: list[str], opts: EstimatorOptions) -> pl.DataFrame:
        stats = rollouts.group_by(group).agg(pl.col("score").median().alias("_b"))
        return rollouts.join(stats, on=group).with_columns(pl.lit(1.0).alias("_s"))

``[credit] advantage`` names the estimator the gold step uses. A ``stateful`` estimator carries
state from run to run (``opts.baseline``, saved with the transitions): the gold step then takes
groups in the order their rewards became known, and a variant rebuild takes all groups at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from pipelines.gold.baselines import RunningBaseline, TenantBaselines, compare_running

STD_EPS = 1e-6


@dataclass
class EstimatorOptions:
    """What an estimator may use besides the rollouts (see `pipelines.gold.credit.advantages`)."""

    normalize_std: bool = True
    baseline: RunningBaseline | TenantBaselines | None = None
    known_baselines: dict[tuple[str, str], float] = field(default_factory=dict)
    held_baselines: dict[tuple[str, str], float] = field(default_factory=dict)


EstimatorFn = Callable[[pl.DataFrame, list[str], EstimatorOptions], pl.DataFrame]


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: EstimatorFn
    stateful: bool = False  # carries a running state between runs (ordered by when rewards became known)


ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, *, stateful: bool = False) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register ``fn`` as the advantage estimator ``name`` (a later registration of a name replaces it)."""

    def add(fn: EstimatorFn) -> EstimatorFn:
        ESTIMATORS[name] = Estimator(name, fn, stateful)
        return fn

    return add


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; a ValueError that lists the known ones otherwise."""
    found = ESTIMATORS.get(name)
    if found is None:
        raise ValueError(f"unknown advantage mode {name!r}; expected {', '.join(ESTIMATORS)}")
    return found


def is_stateful(name: str) -> bool:
    """Whether estimator ``name`` carries state between runs (unknown names: no)."""
    found = ESTIMATORS.get(name)
    return found is not None and found.stateful


@register("grpo")
def grpo(rollouts: pl.DataFrame, group: list[str], opts: EstimatorOptions) -> pl.DataFrame:
    """GRPO: the group's mean, divided by its std (``normalize_std``); a group of one keeps its score."""
    stats = rollouts.group_by(group).agg(
        pl.col("score").mean().alias("_b"),
        pl.col("score").std(ddof=1).alias("_sd"),
        pl.len().alias("_n"),
    )
    return rollouts.join(stats, on=group).with_columns(
        pl.when(pl.col("_n") > 1).then(pl.col("_b")).otherwise(pl.col("score")).alias("_b"),
        (pl.when((pl.col("_n") > 1) & pl.lit(opts.normalize_std)).then(pl.col("_sd") + STD_EPS).otherwise(1.0)).alias(
            "_s"
        ),
    )


@register("rloo")
def rloo(rollouts: pl.DataFrame, group: list[str], opts: EstimatorOptions) -> pl.DataFrame:
    """RLOO: the mean of the other rollouts of the group."""
    stats = rollouts.group_by(group).agg(pl.col("score").sum().alias("_sum"), pl.len().alias("_n"))
    return rollouts.join(stats, on=group).with_columns(
        pl.when(pl.col("_n") > 1)
        .then((pl.col("_sum") - pl.col("score")) / (pl.col("_n") - 1))
        .otherwise(pl.col("score"))
        .alias("_b"),
        pl.lit(1.0).alias("_s"),
    )


@register("running_baseline", stateful=True)
def running_baseline(rollouts: pl.DataFrame, group: list[str], opts: EstimatorOptions) -> pl.DataFrame:
    """A running baseline per (tenant, agent), in the order rewards became known (`pipelines.gold.credit`)."""
    state = opts.baseline if opts.baseline is not None else TenantBaselines()
    known, held = opts.known_baselines, opts.held_baselines
    rollouts = rollouts.sort("_order", "tenant", "rollout_id", "_attempt")
    b: list[float] = []
    for tenant_, rollout, agent_, score, is_default in rollouts.select(
        "tenant", "rollout_id", "_agent", "score", "_default"
    ).iter_rows():
        key = (tenant_, rollout)
        if key in known:
            b.append(known[key])
        elif is_default and key in held:
            b.append(held[key])
        else:
            b.append(compare_running(state, tenant_, agent_, score, default=bool(is_default)))
    return rollouts.with_columns(pl.Series("_b", b, pl.Float64), pl.lit(1.0).alias("_s"))


@register("none")
def no_baseline(rollouts: pl.DataFrame, group: list[str], opts: EstimatorOptions) -> pl.DataFrame:
    """No baseline: the advantage is the score."""
    return rollouts.with_columns(pl.lit(0.0).alias("_b"), pl.lit(1.0).alias("_s"))
