"""Which rollout each span belongs to: one rule, applied to whole traces (pure Polars, no I/O).

A span names its rollout with ``agentlake.rollout.id`` (or Agent Lightning's key), on itself or on
its resource; the decoder writes that id into ``spans.rollout_id`` and, for a span that names
none, the trace id. Exporters send a trace in pieces (the OTel ``BatchSpanProcessor`` ships
children before their root), so the rollout is a property of the *trace*, decided from all of its
spans, whatever order and request they came in:

1. a trace's rollout is the smallest id that any of its spans names (one id in practice; taking the
   smallest makes the choice independent of arrival);
2. a trace that names none and holds only gateway spans (a client that forwards no trace context
   through the gateway) joins the rollout, and attempt, of the client trace that recorded a call
   with the same response id, so the gateway's exact tokens replace the client's retokenized call;
3. otherwise the trace id is the rollout id.

Keys include the tenant: nothing of one tenant resolves into another tenant's rollout. The
collector keys Kafka records by trace id and decides nothing, so this module is the only place
the rule is written.
"""

from __future__ import annotations

import polars as pl

from schemas import attributes as A

TRACE_KEY = ["tenant", "trace_id"]


def _named_rollout() -> pl.Expr:
    """The rollout id a span names itself (null when it carries only its trace id)."""
    rid = pl.col("rollout_id")
    return pl.when(rid.is_not_null() & (rid != "") & (rid != pl.col("trace_id"))).then(rid)


def trace_rollouts(spans: pl.DataFrame) -> pl.DataFrame:
    """One row per (tenant, trace_id) of ``spans``: ``rollout_id`` and, for adopted traces, ``_attempt``."""
    gateway = (pl.col("service_name") == A.GATEWAY_SERVICE_NAME).fill_null(False)
    traces = spans.group_by(TRACE_KEY).agg(
        _named_rollout().min().alias("_named"),
        gateway.all().alias("_gateway_only"),
    )
    adopted = _adopted_by_response_id(spans, traces)
    return (
        traces.join(adopted, on=TRACE_KEY, how="left", nulls_equal=True)
        .with_columns(pl.coalesce("_named", "_adopted", "trace_id").alias("rollout_id"))
        .select(*TRACE_KEY, "rollout_id", "_attempt")
    )


def _adopted_by_response_id(spans: pl.DataFrame, traces: pl.DataFrame) -> pl.DataFrame:
    """Rule 2: gateway-only traces without a named rollout, matched to a client call by response id."""
    orphans = traces.filter(pl.col("_named").is_null() & pl.col("_gateway_only")).select(TRACE_KEY)
    empty = pl.DataFrame(
        schema={"tenant": pl.String, "trace_id": pl.String, "_adopted": pl.String, "_attempt": pl.String}
    )
    if orphans.is_empty():
        return empty
    calls = spans.filter(pl.col("llm_response_id").is_not_null())
    gateway = (pl.col("service_name") == A.GATEWAY_SERVICE_NAME).fill_null(False)
    wanted = calls.join(orphans, on=TRACE_KEY, how="semi").select(*TRACE_KEY, "llm_response_id")
    clients = (
        calls.filter(~gateway)
        .join(traces.select(*TRACE_KEY, "_named"), on=TRACE_KEY)
        .select(
            "tenant",
            "llm_response_id",
            pl.coalesce("_named", "trace_id").alias("_adopted"),
            pl.col("attempt_id").alias("_attempt"),
        )
    )
    if wanted.is_empty() or clients.is_empty():
        return empty
    return (
        wanted.join(clients, on=["tenant", "llm_response_id"])
        .sort(*TRACE_KEY, "_adopted", "_attempt", nulls_last=True)
        .group_by(TRACE_KEY)
        .agg(pl.col("_adopted").first(), pl.col("_attempt").first())
    )


def resolve_rollouts(spans: pl.DataFrame) -> pl.DataFrame:
    """``spans`` with ``rollout_id`` replaced by its trace's rollout (rules above).

    Pass every span of each trace involved (and, for rule 2, the client traces sharing a response
    id); the result for a trace depends on nothing else.
    """
    if spans.is_empty():
        return spans
    mapping = trace_rollouts(spans)
    return (
        spans.drop("rollout_id")
        .join(mapping, on=TRACE_KEY, how="left", nulls_equal=True)
        .with_columns(pl.coalesce("attempt_id", "_attempt").alias("attempt_id"))
        .drop("_attempt")
        .select(spans.columns)
    )
