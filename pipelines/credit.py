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
single-sample production traffic (one per tenant), or none; then broadcast to the calls as A·w_t,
or for per_step (G_t-b)/s. Groups and baselines never span tenants: one tenant's rewards cannot
move another's advantages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import polars as pl

from schemas.topics import DEFAULT_TENANT

CreditMode = Literal["identical", "discounted", "per_step", "last_only"]
AdvantageMode = Literal["grpo", "rloo", "running_baseline", "none"]
STD_EPS = 1e-6
BASELINE_DECAY = 0.9  # running baseline: after ~10 samples, an EMA with this decay


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


@dataclass
class RunningBaseline:
    """State of the running baseline, carried from one run to the next in Delta commit metadata."""

    value: float = 0.0
    count: int = 0

    def advance(self, score: float) -> float:
        """Return the baseline for ``score`` (before seeing it), then update."""
        before = self.value if self.count else 0.0
        self.count += 1
        rate = max(1.0 / self.count, 1.0 - BASELINE_DECAY)
        self.value = self.value + rate * (score - self.value) if self.count > 1 else score
        return before

    def to_json(self) -> str:
        return json.dumps({"value": self.value, "count": self.count})

    @classmethod
    def from_json(cls, text: str | None) -> RunningBaseline:
        if not text:
            return cls()
        d = json.loads(text)
        return cls(float(d["value"]), int(d["count"]))


@dataclass
class TenantBaselines:
    """One running baseline per tenant, so one tenant's rewards never move another's advantages.

    Saved as the single baseline was (``value``, ``count``: the default tenant's), plus the other
    tenants under ``tenants``: a lake from before keeps its baseline, and one tenant's is unchanged.
    """

    by_tenant: dict[str, RunningBaseline] = field(default_factory=dict)

    def of(self, tenant: str) -> RunningBaseline:
        """The tenant's baseline, started empty the first time the tenant is seen."""
        return self.by_tenant.setdefault(tenant, RunningBaseline())

    def to_json(self) -> str:
        default = self.by_tenant.get(DEFAULT_TENANT, RunningBaseline())
        out: dict[str, object] = {"value": default.value, "count": default.count}
        others = {t: {"value": b.value, "count": b.count} for t, b in sorted(self.by_tenant.items())}
        others.pop(DEFAULT_TENANT, None)
        if others:
            out["tenants"] = others
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str | None) -> TenantBaselines:
        if not text:
            return cls()
        d = json.loads(text)
        out = cls()
        if int(d.get("count", 0)):
            out.by_tenant[DEFAULT_TENANT] = RunningBaseline(float(d["value"]), int(d["count"]))
        for tenant, b in (d.get("tenants") or {}).items():
            out.by_tenant[tenant] = RunningBaseline(float(b["value"]), int(b["count"]))
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


def _state_of(state: RunningBaseline | TenantBaselines, tenant: str) -> RunningBaseline:
    return state.of(tenant) if isinstance(state, TenantBaselines) else state


def advantages(
    calls: pl.DataFrame,
    mode: AdvantageMode,
    *,
    normalize_std: bool = True,
    per_step: bool = False,
    baseline: RunningBaseline | TenantBaselines | None = None,
    known_baselines: dict[tuple[str, str], float] | None = None,
) -> pl.DataFrame:
    """Add ``advantage`` and ``baseline``: per rollout from ``score`` over its group, then broadcast.

    A group is ``group_id`` within the rollout's ``tenant`` (when the calls carry one), and each
    tenant has its own running baseline (``TenantBaselines``; a plain ``RunningBaseline`` serves
    calls without tenants). For the running baseline, ``known_baselines`` (by (tenant, rollout id))
    holds what rollouts seen before were compared with: they keep it, and only rollouts new to it
    advance the running value, so recomputing a group never counts a rollout twice.
    """
    rid = pl.col("rollout_id") if "rollout_id" in calls.columns else pl.col("_attempt").alias("rollout_id")
    tenant = pl.col("tenant") if "tenant" in calls.columns else pl.lit(DEFAULT_TENANT).alias("tenant")
    group = ["tenant", "group_id"]
    rollouts = calls.group_by("_attempt").agg(
        rid.first(), tenant.first(), pl.col("group_id").first(), pl.col("score").first(), pl.col("_order").first()
    )
    if mode == "grpo":
        stats = rollouts.group_by(group).agg(
            pl.col("score").mean().alias("_b"),
            pl.col("score").std(ddof=1).alias("_sd"),
            pl.len().alias("_n"),
        )
        rollouts = rollouts.join(stats, on=group).with_columns(
            pl.when(pl.col("_n") > 1).then(pl.col("_b")).otherwise(pl.col("score")).alias("_b"),
            (pl.when((pl.col("_n") > 1) & pl.lit(normalize_std)).then(pl.col("_sd") + STD_EPS).otherwise(1.0)).alias(
                "_s"
            ),
        )
    elif mode == "rloo":
        stats = rollouts.group_by(group).agg(pl.col("score").sum().alias("_sum"), pl.len().alias("_n"))
        rollouts = rollouts.join(stats, on=group).with_columns(
            pl.when(pl.col("_n") > 1)
            .then((pl.col("_sum") - pl.col("score")) / (pl.col("_n") - 1))
            .otherwise(pl.col("score"))
            .alias("_b"),
            pl.lit(1.0).alias("_s"),
        )
    elif mode == "running_baseline":
        state = baseline if baseline is not None else TenantBaselines()
        known = known_baselines or {}
        rollouts = rollouts.sort("_order", "_attempt")
        keys = zip(rollouts["tenant"].to_list(), rollouts["rollout_id"].to_list(), strict=True)
        b = [
            known[key] if key in known else _state_of(state, key[0]).advance(s)
            for key, s in zip(keys, rollouts["score"].to_list(), strict=True)
        ]
        rollouts = rollouts.with_columns(pl.Series("_b", b, pl.Float64), pl.lit(1.0).alias("_s"))
    elif mode == "none":
        rollouts = rollouts.with_columns(pl.lit(0.0).alias("_b"), pl.lit(1.0).alias("_s"))
    else:
        raise ValueError(f"unknown advantage mode {mode!r}; expected grpo, rloo, running_baseline or none")
    df = calls.join(rollouts.select("_attempt", "_b", "_s"), on="_attempt")
    if per_step:
        adv = (pl.col("return") - pl.col("_b")) / pl.col("_s")
    else:
        adv = (pl.col("score") - pl.col("_b")) / pl.col("_s") * pl.col("weight")
    return df.with_columns(adv.alias("advantage"), pl.col("_b").alias("baseline")).drop("_b", "_s")
