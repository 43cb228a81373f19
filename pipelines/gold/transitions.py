"""Finished trajectories to `transitions` rows: select, tokenize, merge, assign credit.

Pure: a Polars frame of `trajectories` rows in, an Arrow table of `transitions` rows out, plus a
count of every row left out and why (the trainer must be able to tell "no data" from "all dropped").
A rollout is (tenant, rollout id) and a group (tenant, task): two tenants' rollouts never share
an attempt choice, a GRPO group, a baseline or a transition id.

A finished rollout without a final reward waits for it until the reward horizon passes
(`pipelines.gold.reward_horizon`, relative to ``now``), then is dropped or given the default.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa

from pipelines import keys
from pipelines.gold.baselines import RunningBaseline, TenantBaselines
from pipelines.gold.credit import advantages, assign_credit, match_first_occurrence
from pipelines.gold.estimators import is_stateful
from pipelines.gold.retokenize import Retokenizer, normalize
from pipelines.gold.reward_horizon import with_rewards
from pipelines.gold.token_check import EXACT, MISMATCH, status, worst
from pipelines.silver.trajectories import latest_terminal_attempts
from schemas import attributes as A
from schemas.agent_filter import agent_mask
from schemas.config import CreditSettings
from schemas.config.training import AdvantageMode, CreditMode
from schemas.tables import TRANSITIONS


@dataclass
class TransitionsResult:
    table: pa.Table
    dropped: Counter[str] = field(default_factory=Counter)
    merge_mismatches: int = 0
    rollouts: int = 0
    baseline: RunningBaseline | TenantBaselines | None = None
    defaulted: int = 0  # rollouts trained with credit.missing_reward
    token_status: Counter[str] = field(default_factory=Counter)  # calls by token_status, dropped ones too
    merge_breaks: Counter[str] = field(default_factory=Counter)  # why consecutive calls were not merged


def _break_reason(prev: dict[str, Any]) -> str:
    """Why a call's prompt did not continue the previous call's prompt and response, as far as the
    previous response tells: its tool calls re-serialized by the template, its reasoning stripped
    from the history, or something else (the agent edited the history, another template)."""
    try:
        out = normalize(prev.get("output_messages"))
    except ValueError:
        out = []
    if any(m.get("tool_calls") for m in out):
        return "tool_call_reserialized"
    if any(m.get("reasoning_content") or "<think>" in str(m.get("content") or "") for m in out):
        return "reasoning_stripped"
    return "other"


def _step_rewards(
    rollout: dict[str, Any], ends: list[int], reward_name: str | None = None
) -> tuple[list[float | None], bool]:
    """Per-call rewards by first-occurrence matching, and whether the final reward (the last named
    ``reward_name``, else the last primary, else the first: as ``final_reward_entry``) found a call."""
    rewards = rollout["rewards"] or []
    times = [int(r["event_time"].timestamp() * 1e6) for r in rewards]
    assigned = match_first_occurrence(ends, times)
    chosen = [i for i, r in enumerate(rewards) if reward_name and r["name"] == reward_name]
    primaries = [i for i, r in enumerate(rewards) if r["name"] == A.PRIMARY_REWARD_NAME]
    final_idx = (chosen or primaries or [0])[-1]
    values = [None if j is None else float(rewards[j]["value"]) for j in assigned]
    return values, final_idx in assigned


def _merge(rows: list[dict[str, Any]], reasons: Counter[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Merge consecutive calls whose prompt continues prompt+response token for token; count in
    ``reasons`` why the others stayed apart (`_break_reason`)."""
    out: list[dict[str, Any]] = []
    mismatches = 0
    for row in rows:
        if out and out[-1]["_attempt"] == row["_attempt"]:
            prev = out[-1]
            full = prev["prompt_ids"] + prev["response_ids"]
            if row["prompt_ids"][: len(full)] == full:
                obs = row["prompt_ids"][len(full) :]
                prev["response_ids"] = prev["response_ids"] + obs + row["response_ids"]
                prev["loss_mask"] = prev["loss_mask"] + [0] * len(obs) + [1] * len(row["response_ids"])
                if prev["response_logprobs"] is not None and row["response_logprobs"] is not None:
                    prev["response_logprobs"] = prev["response_logprobs"] + [0.0] * len(obs) + row["response_logprobs"]
                else:
                    prev["response_logprobs"] = None
                prev["merged_calls"] += 1
                prev["token_status"] = worst(prev["token_status"], row["token_status"])
                if row["step_reward"] is not None:
                    prev["step_reward"] = (prev["step_reward"] or 0.0) + row["step_reward"]
                continue
            mismatches += 1
            if reasons is not None:
                reasons[_break_reason(prev)] += 1
        out.append(dict(row))
    return out, mismatches


def _check_exact(calls: pl.DataFrame, retokenizer: Retokenizer) -> pl.DataFrame:
    """Exact calls whose engine prompt ids are not the policy template's rendering of the recorded request
    (messages and tools) become "mismatch": the engine rendered with another template than the one
    the trainer and the retokenizer use. Done here, not in the gateway: collectors do not load tokenizers."""
    statuses = []
    for st, ids, msgs, tools in calls.select("token_status", "prompt_ids", "input_messages", "tools").iter_rows():
        if st == EXACT and msgs:
            ours = retokenizer.prompt_ids(msgs, tools)
            st = EXACT if ours is None or ours == list(ids) else MISMATCH
        statuses.append(st)
    return calls.with_columns(pl.Series("token_status", statuses, pl.String))


def build(
    traj: pl.DataFrame,
    credit: CreditSettings,
    *,
    now: dt.datetime,
    retokenizer: Retokenizer | Callable[[], Retokenizer | None] | None = None,
    verifier: Callable[[Any, Any], list[int] | None] | None = None,
    baseline: RunningBaseline | TenantBaselines | None = None,
    known_baselines: dict[tuple[str, str], float] | None = None,
    held_baselines: dict[tuple[str, str], float] | None = None,
) -> TransitionsResult:
    """`trajectories` rows (all rollouts of the affected groups) to `transitions` rows.

    ``now`` decides which rollouts without a reward have passed the reward horizon; ``known_baselines``
    and ``held_baselines`` are what rollouts were compared with before (`pipelines.gold.credit.advantages`).
    ``verifier`` gives the served model's prompt ids for a call's (input messages, tools)
    (`pipelines.gold.token_check.TokenizeEndpoint`), or None: retokenized calls are then "verified" or
    "mismatch", else "unverified"; calls with the engine's ids are "exact". The engine's ids are not
    checked against the template here (redacted or re-encoded messages would read as a mismatch where
    the ids are right): those are the tokens the policy saw and sampled.
    """
    mode: CreditMode = credit.mode
    adv_mode: AdvantageMode = credit.advantage
    res = TransitionsResult(table=TRANSITIONS.empty_table(), baseline=baseline)
    kept, superseded = latest_terminal_attempts(traj)
    if superseded:
        res.dropped["superseded_attempt"] += int(superseded)
    kept, res.defaulted = with_rewards(kept, credit, now, res.dropped)
    kept = kept.filter(pl.col("n_llm_calls") > 0)
    if kept.is_empty():
        return res

    kept = kept.with_columns(
        # the rollout attempt as one string (the unit steps, merging and advantages are computed over)
        keys.attempt_key().alias("_attempt"),
        pl.coalesce("task_id", "rollout_id").alias("group_id"),
        pl.col("agents").list.first().alias("_agent0"),
    )
    calls = (
        kept.select(
            "_attempt",
            "rollout_id",
            "attempt_id",
            "tenant",
            "task_id",
            "group_id",
            "final_reward",
            "reward_source",
            "_default_reward",
            "day",
            "_order",
            "_agent0",
            "calls",
        )
        .explode("calls")
        .unnest("calls")
    )
    if "policy_sha256" not in calls.columns:  # trajectories written before v2 (calls without the hash)
        calls = calls.with_columns(pl.lit(None, pl.String).alias("policy_sha256"))
    if "tools" not in calls.columns:  # calls recorded without their tool definitions
        calls = calls.with_columns(pl.lit(None, pl.String).alias("tools"))
    calls = calls.with_columns(pl.coalesce("agent_name", "_agent0").alias("agent_name"))

    # --- agent filter
    ok = pl.Series(agent_mask(credit.agent_pattern, calls["agent_name"].to_arrow()))
    if (~ok).sum():
        res.dropped["agent_filtered"] += int((~ok).sum())
    calls = calls.filter(ok)

    # --- tokens: exact where the gateway/SDK recorded them, else the policy's chat template
    exact = pl.col("prompt_token_ids").is_not_null() & pl.col("completion_token_ids").is_not_null()
    calls = calls.with_columns(
        pl.when(exact).then(pl.lit("exact")).otherwise(pl.lit("retokenized")).alias("token_source"),
        pl.when(exact).then(pl.lit(EXACT)).otherwise(pl.lit(None, pl.String)).alias("token_status"),
        pl.col("prompt_token_ids").alias("prompt_ids"),
        pl.col("completion_token_ids").alias("response_ids"),
        pl.when(pl.col("completion_logprobs").list.len() == pl.col("completion_token_ids").list.len())
        .then(pl.col("completion_logprobs"))
        .alias("response_logprobs"),
    )
    need = calls.filter(~exact)
    if need.height and callable(retokenizer):
        retokenizer = retokenizer()  # loaded only when some call lacks token ids
    if need.height:
        prompts: list[list[int] | None] = []
        responses: list[list[int] | None] = []
        statuses: list[str | None] = []
        for row in need.select("input_messages", "output_messages", "tools").iter_rows():
            enc = retokenizer.encode(*row) if isinstance(retokenizer, Retokenizer) else None
            prompts.append(enc[0] if enc else None)
            responses.append(enc[1] if enc else None)
            statuses.append(status(enc[0], verifier(row[0], row[2]) if verifier else None) if enc else None)
        filled = need.with_columns(
            pl.Series("prompt_ids", prompts, pl.List(pl.Int32)),
            pl.Series("response_ids", responses, pl.List(pl.Int32)),
            pl.lit(None, pl.List(pl.Float32)).alias("response_logprobs"),
            pl.Series("token_status", statuses, pl.String),
        )
        missing = filled.filter(pl.col("response_ids").is_null() | pl.col("prompt_ids").is_null()).height
        if missing:
            tok = isinstance(retokenizer, Retokenizer)
            res.dropped["no_tokens" if tok else "no_tokens_no_tokenizer"] += missing
        calls = pl.concat([calls.filter(exact), filled.filter(pl.col("response_ids").is_not_null())])
    calls = calls.filter(pl.col("response_ids").list.len() > 0)
    if credit.check_exact_tokens and calls.filter(exact & pl.col("input_messages").is_not_null()).height:
        if callable(retokenizer):
            retokenizer = retokenizer()
        if isinstance(retokenizer, Retokenizer):
            calls = _check_exact(calls, retokenizer)
    res.token_status.update({s: int(n) for s, n in calls["token_status"].value_counts().iter_rows()})
    if not credit.train_token_mismatch:
        mismatched = pl.col("token_status") == MISMATCH
        if n_mismatched := int(calls.select(mismatched.sum()).item()):
            res.dropped["token_mismatch"] += n_mismatched
            calls = calls.filter(~mismatched)
    calls = calls.sort("_attempt", "step")

    # --- per-step rewards (first-occurrence matching, as Agent Lightning does)
    if mode == "per_step":
        ends = calls.group_by("_attempt", maintain_order=True).agg(pl.col("end_time").dt.epoch("us").fill_null(0))
        by_attempt = {
            r["_attempt"]: r for r in kept.select("_attempt", "rewards", "final_reward").iter_rows(named=True)
        }
        step_rewards: list[float | None] = []
        final_matched: dict[str, bool] = {}
        for attempt, e in ends.iter_rows():
            m, fm = _step_rewards(by_attempt[attempt], list(e), credit.reward)
            step_rewards.extend(m)
            final_matched[attempt] = fm
        calls = calls.with_columns(
            pl.Series("step_reward", step_rewards, pl.Float64),
            pl.col("_attempt").replace_strict(final_matched, return_dtype=pl.Boolean).alias("_final_matched"),
        )
    else:
        calls = calls.with_columns(pl.lit(None, pl.Float64).alias("step_reward"), pl.lit(False).alias("_final_matched"))
    calls = calls.with_columns(
        pl.col("response_ids").list.eval(pl.element() * 0 + 1).cast(pl.List(pl.Int8)).alias("loss_mask"),
        pl.lit(1, pl.Int32).alias("merged_calls"),
    )

    # --- optional merging of calls that continue each other
    if credit.merge_calls:
        cols = calls.columns
        merged, mism = _merge(calls.to_dicts(), res.merge_breaks)
        res.merge_mismatches = mism
        calls = pl.DataFrame(merged, schema=calls.schema).select(cols)

    too_long = (pl.col("prompt_ids").list.len() + pl.col("response_ids").list.len()) > credit.max_tokens
    n_long = calls.select(too_long.sum()).item()
    if n_long:
        res.dropped["too_long"] += int(n_long)
    calls = calls.filter(~too_long)
    if calls.is_empty():
        return res

    # --- credit: positions 0..T-1 over the transitions that remain
    calls = calls.rename({"step": "_call_step"}).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int32).over("_attempt").alias("step"),
        pl.len().over("_attempt").alias("n_steps"),
    )
    calls = assign_credit(calls, mode, credit.gamma)
    if is_stateful(adv_mode) and res.baseline is None:
        res.baseline = TenantBaselines()
    calls = advantages(
        calls,
        adv_mode,
        normalize_std=credit.normalize_std,
        per_step=mode == "per_step",
        baseline=res.baseline,
        known_baselines=known_baselines,
        held_baselines=held_baselines,
    )
    res.rollouts = calls["_attempt"].n_unique()
    out = calls.with_columns(
        keys.transition_id(("tenant", "rollout_id", "attempt_id", "_call_step")).alias("transition_id"),
        pl.col("_call_step").alias("step"),
        pl.lit(mode).alias("credit_mode"),
        pl.lit(adv_mode).alias("advantage_mode"),
        pl.lit(now).dt.cast_time_unit("us").dt.replace_time_zone("UTC").alias("created_at"),
    ).sort("tenant", "rollout_id", "attempt_id", "step")
    return TransitionsResult(
        table=out.select(TRANSITIONS.names).to_arrow().cast(TRANSITIONS),
        dropped=res.dropped,
        merge_mismatches=res.merge_mismatches,
        rollouts=res.rollouts,
        baseline=res.baseline,
        defaulted=res.defaulted,
        token_status=res.token_status,
        merge_breaks=res.merge_breaks,
    )
