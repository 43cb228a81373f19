"""Credit assignment and advantages: pure functions over one row per LLM call.

Modes (``reward``, ``return`` and the weight an advantage gets at step t of T calls, R the
rollout's final reward):

    identical   r_t = R             G_t = R                 w_t = 1        (LightningRL)
    last_only   r_t = R·[t=T-1]     G_t = r_t               w_t = [t=T-1]
    discounted  r_t = R·[t=T-1]     G_t = γ^(T-1-t)·R       w_t = γ^(T-1-t)
    per_step    r_t = matched step rewards (first occurrence; R on the last call when it was not
                matched to one)     G_t = Σ_{k≥t} γ^(k-t)·r_k

Advantages are computed per rollout from its score S (R, or G_0 for per_step) against its group
(the task of its tenant): GRPO (S-mean)/std, RLOO S-mean(others), a running baseline S-b for
single-sample production traffic (one per (tenant, agent)), or none (each an estimator registered by
name in `pipelines.gold.estimators`, where a new one plugs in); then broadcast to the calls as
A·w_t, or for per_step (G_t-b)/s. Groups and baselines never span tenants: one tenant's rewards
cannot move another's advantages.

The running baseline is a function of the event order, not of how runs batched the data: rollouts
are taken in the order their reward became known (``_order``: the final reward's time, or the
rollout's end when later; for a default reward, when the reward horizon passed), and a rollout
counted once keeps the baseline it was compared with (``known_baselines``). So when every run sees
the data up to its own moment (the lake fills in time order), running it incrementally in any
batches gives what one run over everything gives. A reward stamped earlier than rewards already
counted is counted when it arrives (a rebuild counts it at its time). A default reward is compared
with the baseline but never moves it: the baseline is a mean of real rewards, and a real reward that
arrives after its default advances it then, once.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from pipelines.gold.baselines import RunningBaseline, TenantBaselines
from pipelines.gold.estimators import EstimatorOptions, get_estimator
from schemas.config.training import AdvantageMode, CreditMode
from schemas.topics import DEFAULT_TENANT


def match_first_occurrence(call_ends: Sequence[int], reward_times: Sequence[int]) -> list[int | None]:
    """Agent Lightning's FIRST_OCCURRENCE policy: each reward (in time order) goes to the latest
    call that ended at or before it and has no reward yet. Returns, per call, the index of its
    reward in ``reward_times`` or None."""
    out: list[int | None] = [None] * len(call_ends)
    for j in sorted(range(len(reward_times)), key=lambda j: reward_times[j]):
        for i in range(len(call_ends) - 1, -1, -1):
            if call_ends[i] > reward_times[j] or out[i] is not None:
                continue
            out[i] = j
            break
    return out


def assign_credit(calls: pl.DataFrame, mode: CreditMode, gamma: float) -> pl.DataFrame:
    """Add ``reward``, ``return``, ``weight`` and ``score`` to calls.

    ``calls`` needs: rollout key columns ``_attempt``, ``step`` (0..T-1), ``n_steps``, ``final_reward``
    and, for per_step, ``step_reward`` (nullable).
    """
    last = pl.col("step") == pl.col("n_steps") - 1
    R = pl.col("final_reward")
    k = (pl.col("n_steps") - 1 - pl.col("step")).cast(pl.Float64)
    if mode == "identical":
        return calls.with_columns(reward=R, **{"return": R}, weight=pl.lit(1.0), score=R)
    if mode == "last_only":
        r = pl.when(last).then(R).otherwise(0.0)
        return calls.with_columns(reward=r, **{"return": r}, weight=last.cast(pl.Float64), score=R)
    if mode == "discounted":
        w = pl.lit(gamma).pow(k) if gamma > 0 else last.cast(pl.Float64)
        return calls.with_columns(reward=pl.when(last).then(R).otherwise(0.0), **{"return": R * w}, weight=w, score=R)
    if mode == "per_step":
        matched_final = (pl.col("step_reward").is_not_null() & pl.col("_final_matched")).any().over("_attempt")
        r = pl.col("step_reward").fill_null(0.0) + pl.when(last & ~matched_final).then(R).otherwise(0.0)
        df = calls.with_columns(r.alias("reward"))
        if gamma == 0:
            df = df.with_columns(pl.col("reward").alias("return"))
        else:
            # G_t = Σ_{k≥t} γ^(k-t) r_k = γ^-t · (reverse cumulative sum of γ^k r_k)
            gk = pl.lit(gamma).pow(pl.col("step").cast(pl.Float64))
            df = df.sort("_attempt", "step").with_columns(
                ((pl.col("reward") * gk).cum_sum(reverse=True).over("_attempt") / gk).alias("return")
            )
        return df.with_columns(
            weight=pl.lit(1.0), score=pl.col("return").filter(pl.col("step") == 0).first().over("_attempt")
        )
    raise ValueError(f"unknown credit mode {mode!r}; expected identical, discounted, per_step or last_only")


def advantages(
    calls: pl.DataFrame,
    mode: AdvantageMode,
    *,
    normalize_std: bool = True,
    per_step: bool = False,
    baseline: RunningBaseline | TenantBaselines | None = None,
    known_baselines: dict[tuple[str, str], float] | None = None,
    held_baselines: dict[tuple[str, str], float] | None = None,
) -> pl.DataFrame:
    """Add ``advantage`` and ``baseline``: per rollout from ``score`` over its group, then broadcast.

    A group is ``group_id`` within the rollout's ``tenant`` (when the calls carry one), and each
    (tenant, agent) has its own running baseline (``TenantBaselines``; the agent is ``_agent0``, the
    rollout's first, else its first call's ``agent_name``; a plain ``RunningBaseline`` serves calls
    without tenants). Rollouts are taken in ``_order`` (see the module doc). For the running baseline,
    ``known_baselines`` (by (tenant, rollout id)) holds what rollouts counted before were compared
    with: they keep it, and only rollouts new to it advance the running value, so recomputing a group
    never counts a rollout twice. Rollouts whose ``_default_reward`` is set are compared without
    advancing; ``held_baselines`` holds what such rollouts were compared with before (they keep it
    while their reward is still the default; a real one is counted when it comes).
    """
    rid = pl.col("rollout_id") if "rollout_id" in calls.columns else pl.col("_attempt").alias("rollout_id")
    tenant = pl.col("tenant") if "tenant" in calls.columns else pl.lit(DEFAULT_TENANT).alias("tenant")
    group = ["tenant", "group_id"]
    agent = pl.col("agent_name").first() if "agent_name" in calls.columns else pl.lit(None, pl.String)
    if "_agent0" in calls.columns:
        agent = pl.coalesce(pl.col("_agent0").first(), agent)
    default = pl.col("_default_reward").first() if "_default_reward" in calls.columns else pl.lit(False)
    rollouts = calls.group_by("_attempt").agg(
        rid.first(),
        tenant.first(),
        pl.col("group_id").first(),
        pl.col("score").first(),
        pl.col("_order").first(),
        agent.alias("_agent"),
        default.alias("_default"),
    )
    opts = EstimatorOptions(normalize_std, baseline, known_baselines or {}, held_baselines or {})
    rollouts = get_estimator(mode).fn(rollouts, group, opts)
    df = calls.join(rollouts.select("_attempt", "_b", "_s"), on="_attempt")
    if per_step:
        adv = (pl.col("return") - pl.col("_b")) / pl.col("_s")
    else:
        adv = (pl.col("score") - pl.col("_b")) / pl.col("_s") * pl.col("weight")
    return df.with_columns(adv.alias("advantage"), pl.col("_b").alias("baseline")).drop("_b", "_s")
