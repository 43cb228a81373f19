"""The reward horizon: what a finished rollout without a reward becomes, and when.

A finished rollout without a final reward waits for one (``no_reward_waiting``) until
``credit.reward_horizon_s`` after its end (unset: forever); then it is dropped
(``no_reward_expired``) or trained with ``credit.missing_reward`` (``reward_source = "default"``).
A real reward always wins, whenever it comes: the rollout is built again with it.

The transitions step asks `lapsed` which rollouts passed the horizon since its last run (so a run
picks them up with no new data), `build` asks `with_rewards` what each rollout's reward is now, and
the sensor asks `horizon_due` whether a run is due at all.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import polars as pl

from pipelines.silver.trajectories import TERMINAL, final_reward_entry
from schemas.config import CreditSettings
from schemas.lake import Lake

# The end time (epoch us) before which a finished rollout without a reward had passed the reward horizon
# as of the last transitions run: a run picks up those that passed it since, once each, with no new data.
EXPIRED_UNTIL = "trajectories.expired_until"


def expired(credit: CreditSettings, now: dt.datetime) -> pl.Expr:
    """Rows of `trajectories` whose reward horizon has passed at ``now`` (never, without a horizon)."""
    if not credit.reward_horizon_s:
        return pl.lit(False)
    return pl.col("end_time") < now - dt.timedelta(seconds=credit.reward_horizon_s)


def known_at(credit: CreditSettings) -> pl.Expr:
    """When a `trajectories` row's final reward became known: the reward's time, or the rollout's end
    when later; without a reward, when its horizon passed (the default's time). The running baseline
    counts rollouts in this order (`pipelines.gold.credit`)."""
    horizon = dt.timedelta(seconds=credit.reward_horizon_s or 0)
    return (
        pl.when(pl.col("final_reward").is_null())
        .then(pl.col("end_time") + horizon)
        .otherwise(pl.max_horizontal("end_time", final_reward_entry("event_time", credit.reward)))
    )


def with_rewards(
    kept: pl.DataFrame, credit: CreditSettings, now: dt.datetime, dropped: Counter[str]
) -> tuple[pl.DataFrame, int]:
    """Give each rollout its final reward, where it came from and when it became known (``_order``):
    waiting ones are left out, expired ones dropped or given the default (the module doc). Counts the
    calls left out in ``dropped``; returns the rows and how many rollouts got the default reward."""
    missing = pl.col("final_reward").is_null()
    gone = expired(credit, now).fill_null(False)
    calls = pl.col("n_llm_calls").fill_null(0)
    waiting = kept.filter(missing & ~gone).select(calls.sum()).item()
    if waiting:
        dropped["no_reward_waiting"] += int(waiting)
    default = credit.missing_reward
    defaulted = 0
    if default == "drop":
        lost = kept.filter(missing & gone).select(calls.sum()).item()
        if lost:
            dropped["no_reward_expired"] += int(lost)
        kept = kept.filter(~missing)
    else:
        defaulted = kept.filter(missing & gone & (calls > 0)).height
        kept = kept.filter(~missing | gone)
    rows = kept.with_columns(
        missing.alias("_default_reward"),
        pl.when(missing)
        .then(pl.lit("default"))
        .otherwise(final_reward_entry("source", credit.reward))
        .alias("reward_source"),
        pl.col("final_reward").fill_null(0.0 if default == "drop" else float(default)),
        known_at(credit).alias("_order"),
    )
    return rows, defaulted


def lapsed(
    traj: pl.LazyFrame, credit: CreditSettings, now: dt.datetime, since_us: int | None
) -> tuple[pl.LazyFrame | None, int | None]:
    """Finished rollouts without a reward whose horizon passed since the last run (end time in
    [``since_us``, now - horizon)), and the new mark; (None, None) without a horizon."""
    if not credit.reward_horizon_s:
        return None, None
    cutoff = now - dt.timedelta(seconds=credit.reward_horizon_s)
    cutoff_us = int(cutoff.timestamp() * 1_000_000)
    waiting = (
        pl.col("final_reward").is_null()
        & pl.col("status").is_in(TERMINAL)
        & (pl.col("n_llm_calls") > 0)
        & expired(credit, now)
    )
    if since_us is not None:
        waiting = waiting & (pl.col("end_time") >= dt.datetime.fromtimestamp(since_us / 1e6, dt.UTC))
    return traj.filter(waiting), max(cutoff_us, since_us or cutoff_us)


def horizon_due(lake: Lake, credit: CreditSettings, *, now: dt.datetime | None = None) -> int | None:
    """Whether a transitions run is due with no new data: the new expiry mark (epoch us) when a finished
    rollout without a reward passed its horizon since the last run, else None. For a sensor: run the
    gold step (its run key the mark) and each such rollout is dropped or given the default once."""
    if not credit.reward_horizon_s:  # the default: nothing ever lapses, so no table is opened per sensor tick
        return None
    table = lake.table("trajectories")
    if table is None:
        return None
    since = lake.txn("transitions", EXPIRED_UNTIL)
    found, until = lapsed(pl.scan_delta(table), credit, now or dt.datetime.now(dt.UTC), since)
    if found is None or not found.select(pl.len()).collect().item():
        return None
    return until
