"""Spans of a rollout to one `trajectories` row per attempt (pure Polars, no I/O).

A rollout's spans may arrive in any order and over several Kafka records, so assembly is a
function of *all* spans of the affected rollouts, recomputed whenever one of them changes:
the span tree is checked (orphans hang from a virtual root, children outside their parent's
time window are re-attached there too, both counted), LLM calls are deduplicated by response id
(the gateway and the agent may both report a call) and ordered, completion is decided, and
rewards from spans and from late events are attached. Every key starts with the tenant
(`pipelines/keys.py`): spans, calls and rewards of one tenant never join another's rollout.
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa

from pipelines import keys
from schemas import attributes as A
from schemas.tables import REWARDS, TRAJECTORIES

TERMINAL = ("finished", "failed", "timed_out")
_KEYS = keys.ATTEMPT
_SPAN = [*keys.TRACE, "span_id"]


def latest_terminal_attempts(traj: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Keep, per rollout, the latest attempt that ended (retries supersede earlier attempts)."""
    done = traj.filter(pl.col("status").is_in(TERMINAL))
    kept = done.sort("end_time", "updated_at", nulls_last=False).unique(keys.ROLLOUT, keep="last")
    return kept, done.height - kept.height


def final_reward_entry(field_name: str, reward_name: str | None = None) -> pl.Expr:
    """A field of the reward entry `assemble` took as ``final_reward``: the last named ``reward_name``
    (``[credit] reward``), else the last primary, else the first."""
    rewards = pl.col("rewards")

    def last_named(name: str) -> pl.Expr:
        named = pl.element().filter(pl.element().struct.field("name") == name).struct.field(field_name)
        return rewards.list.eval(named).list.last()

    return pl.coalesce(
        last_named(reward_name or A.PRIMARY_REWARD_NAME),
        last_named(A.PRIMARY_REWARD_NAME),
        rewards.list.first().struct.field(field_name),
    )


def _fill_attempts(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans without an attempt id inherit the attempt of their trace (e.g. gateway spans)."""
    return spans.with_columns(pl.col("attempt_id").fill_null(pl.col("attempt_id").drop_nulls().max().over(keys.TRACE)))


def _is_root() -> pl.Expr:
    """A span that ends its rollout by being there: no parent, and not a gateway call of a named rollout.

    The gateway records a call sent without ``traceparent`` as a parent-less span of its own trace.
    When the client named the rollout (header or ``/rollout/{id}/`` path), that call is one step
    of a longer rollout, not its root: the rollout runs until an explicit status (the gateway's
    ``POST /rollout/{id}/end``), a root span of the agent's own, or the idle timeout.
    """
    gateway_call = (
        (pl.col("service_name") == A.GATEWAY_SERVICE_NAME)
        & (pl.col("name") == A.LLM_CALL_SPAN_NAME)
        & (pl.col("rollout_id") != pl.col("trace_id"))
    ).fill_null(False)
    return pl.col("parent_span_id").is_null() & ~gateway_call


def resolve_rewards(events: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Give reward events their rollout: named directly, else by trace id, else by LLM response id.

    Each is looked up within the event's tenant only: another tenant's trace or call with the same
    id is never a match.
    """
    if events.is_empty():
        return events
    by_trace = spans.select(*keys.TRACE, pl.col("rollout_id").alias("_r_trace")).unique(keys.TRACE, keep="first")
    by_resp = (
        spans.filter(pl.col("llm_response_id").is_not_null())
        .select(
            "tenant",
            "llm_response_id",
            pl.col("rollout_id").alias("_r_resp"),
            pl.col("attempt_id").alias("_a_resp"),
        )
        .unique(["tenant", "llm_response_id"], keep="first")
    )
    out = events.join(by_trace, on=keys.TRACE, how="left").join(by_resp, on=["tenant", "llm_response_id"], how="left")
    return out.with_columns(
        pl.coalesce("rollout_id", "_r_trace", "_r_resp").alias("rollout_id"),
        pl.coalesce("attempt_id", "_a_resp").alias("attempt_id"),
    ).drop("_r_trace", "_r_resp", "_a_resp")


def assemble(
    spans: pl.DataFrame,
    reward_events: pl.DataFrame | None = None,
    *,
    now: dt.datetime,
    idle_timeout_s: float,
    updated_at: dt.datetime | None = None,
    reward_name: str | None = None,
) -> pa.Table:
    """All spans of some rollouts (+ their reward events) to `trajectories` rows.

    ``spans`` carry resolved rollout ids (`pipelines.silver.identity.resolve_rollouts`); ``updated_at``
    (default ``now``) stamps the rows, so a later commit can be told from an earlier one.
    ``final_reward`` is the last reward named ``reward_name`` (``[credit] reward``), else the last
    named "primary", else the first.
    """
    if spans.is_empty():
        return TRAJECTORIES.empty_table()
    for column in ("policy_sha256", "tools"):  # read from a spans table written before v4 / v5
        if column not in spans.columns:
            spans = spans.with_columns(pl.lit(None, pl.String).alias(column))
    spans = spans.unique(_SPAN, keep="last", maintain_order=True)
    spans = _fill_attempts(spans)

    # --- the tree: orphans and children outside their parent's window go to the virtual root
    parents = spans.select(
        *keys.TRACE,
        pl.col("span_id").alias("parent_span_id"),
        pl.col("start_time").alias("_p_start"),
        pl.col("end_time").alias("_p_end"),
        pl.lit(True).alias("_p_found"),
    )
    spans = spans.join(parents, on=[*keys.TRACE, "parent_span_id"], how="left")
    repaired = pl.col("parent_span_id").is_not_null() & (
        pl.col("_p_found").is_null()
        | (pl.col("start_time") < pl.col("_p_start"))
        | (pl.col("end_time").is_not_null() & pl.col("_p_end").is_not_null() & (pl.col("end_time") > pl.col("_p_end")))
    )
    spans = spans.with_columns(repaired.alias("_repaired"), _is_root().alias("_root"))

    # --- rewards: spans of this rollout, plus resolved events
    span_rewards = spans.filter(pl.col("reward_value").is_not_null()).select(
        *_KEYS,
        pl.col("span_id").alias("reward_id"),
        pl.col("reward_name").fill_null(A.PRIMARY_REWARD_NAME).alias("name"),
        pl.col("reward_value").alias("value"),
        pl.lit("span").alias("source"),
        "span_id",
        pl.col("start_time").alias("event_time"),
    )
    rewards = span_rewards
    if reward_events is not None and not reward_events.is_empty():
        ev = resolve_rewards(reward_events, spans).filter(pl.col("rollout_id").is_not_null())
        attempts = spans.select(_KEYS).unique()
        # An event that names no attempt scores every attempt of its rollout (in its own tenant).
        ev_any = ev.filter(pl.col("attempt_id").is_null()).drop("attempt_id").join(attempts, on=keys.ROLLOUT)
        ev = pl.concat([ev.filter(pl.col("attempt_id").is_not_null()), ev_any.select(ev.columns)])
        ev = ev.select(
            *_KEYS,
            "reward_id",
            "name",
            "value",
            pl.lit("event").alias("source"),
            pl.lit(None, pl.String).alias("span_id"),
            pl.col("event_time").cast(span_rewards.schema["event_time"]),
        )
        rewards = pl.concat([span_rewards, ev])
    rewards = rewards.unique([*_KEYS, "reward_id"], keep="last").sort("event_time", "reward_id")
    reward_agg = rewards.group_by(_KEYS).agg(
        pl.struct("reward_id", "name", "value", "source", "span_id", "event_time").alias("rewards"),
        pl.col("value").filter(pl.col("name") == A.PRIMARY_REWARD_NAME).last().alias("_primary"),
        pl.col("value").filter(pl.col("name") == (reward_name or A.PRIMARY_REWARD_NAME)).last().alias("_chosen"),
        pl.col("value").first().alias("_first"),
    )

    # --- LLM calls, one per response id, in start order
    is_call = pl.col("reward_value").is_null() & (
        pl.col("prompt_token_ids").is_not_null()
        | pl.col("completion_token_ids").is_not_null()
        | pl.col("input_messages").is_not_null()
        | pl.col("output_messages").is_not_null()
    )
    calls = spans.filter(is_call)
    # One call seen twice: a framework/SDK span (messages) whose child is the gateway's span of the
    # same request (exact token ids). Keep the child, the record closest to the model.
    exact_children = (
        calls.filter(pl.col("completion_token_ids").is_not_null() & pl.col("parent_span_id").is_not_null())
        .select(*keys.TRACE, pl.col("parent_span_id").alias("span_id"), pl.lit(True).alias("_has_exact_child"))
        .unique(_SPAN)
    )
    calls = (
        calls.join(exact_children, on=_SPAN, how="left")
        .filter(~pl.col("_has_exact_child").fill_null(False))
        .drop("_has_exact_child")
    )
    calls = calls.with_columns(
        pl.col("completion_token_ids").is_null().alias("_no_ids"),
        pl.coalesce("llm_response_id", "span_id").alias("_dedup"),
    )
    calls = (
        calls.sort("_no_ids", "start_time")
        .unique([*_KEYS, "_dedup"], keep="first")
        .sort("start_time", "span_id")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int32).over(_KEYS).alias("step"))
    )
    call_agg = calls.group_by(_KEYS).agg(
        pl.struct(
            "span_id",
            "step",
            "agent_name",
            "start_time",
            "end_time",
            "llm_response_id",
            "llm_model",
            "policy_version",
            "prompt_token_ids",
            "completion_token_ids",
            "completion_logprobs",
            "input_messages",
            "output_messages",
            "policy_sha256",
            "tools",
        )
        .sort_by("step")
        .alias("calls"),
        pl.col("policy_version").drop_nulls().unique(maintain_order=True).alias("policy_versions"),
        pl.len().cast(pl.Int32).alias("n_llm_calls"),
    )

    # --- one row per attempt
    now_us = pl.lit(now).dt.cast_time_unit("us").dt.replace_time_zone("UTC")
    last_seen = pl.max_horizontal(pl.col("end_time").max(), pl.col("received_at").max())
    base = (
        spans.sort("start_time")
        .group_by(_KEYS)
        .agg(
            pl.col("task_id").drop_nulls().first(),
            pl.col("trace_id").unique(maintain_order=True).alias("trace_ids"),
            pl.col("agent_name").drop_nulls().unique(maintain_order=True).alias("agents"),
            pl.len().cast(pl.Int32).alias("n_spans"),
            pl.col("_repaired").sum().cast(pl.Int32).alias("n_repaired_parents"),
            pl.col("start_time").min(),
            pl.col("end_time").max(),
            pl.col("rollout_status").drop_nulls().last().alias("_explicit"),
            pl.col("_root").any().alias("_has_root"),
            (pl.col("_root") & (pl.col("status_code") == "ERROR")).any().alias("_root_error"),
            last_seen.alias("_last_seen"),
        )
    )
    idle = pl.duration(microseconds=int(idle_timeout_s * 1_000_000))
    status = (
        pl.when(pl.col("_explicit").is_in(["finished", "failed"]))
        .then(pl.col("_explicit"))
        .when(pl.col("_root_error"))
        .then(pl.lit("failed"))
        .when(pl.col("_has_root"))
        .then(pl.lit("finished"))
        .when(pl.col("_last_seen") < now_us - idle)
        .then(pl.lit("timed_out"))
        .otherwise(pl.lit("running"))
    )
    out = (
        base.join(call_agg, on=_KEYS, how="left", nulls_equal=True)
        .join(reward_agg, on=_KEYS, how="left", nulls_equal=True)
        .with_columns(
            status.alias("status"),
            pl.coalesce("_chosen", "_primary", "_first").alias("final_reward"),
            pl.col("n_llm_calls").fill_null(0),
            pl.lit(updated_at or now).dt.cast_time_unit("us").dt.replace_time_zone("UTC").alias("updated_at"),
            pl.col("start_time").dt.date().alias("day"),
        )
        .sort(_KEYS, nulls_last=True)
    )
    return out.select(TRAJECTORIES.names).to_arrow().cast(TRAJECTORIES)


def empty_rewards() -> pl.DataFrame:
    frame = pl.from_arrow(REWARDS.empty_table())
    assert isinstance(frame, pl.DataFrame)
    return frame
