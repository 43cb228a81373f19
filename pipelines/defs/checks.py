"""Asset checks: the invariants the trainer relies on, evaluated on the tables as written.

A check that finds bad transitions names the first rollout holding one, with a link to its page in the
trajectory viewer (``ViewerResource``)."""

from typing import Any

import polars as pl
from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from pipelines.defs.assets import rewards, spans, trajectories, transitions
from pipelines.defs.resources import CreditResource, LakeResource, ViewerResource
from pipelines.gold.token_check import MISMATCH, STATUSES, TOKEN_STATUS_PREFIX
from trainer.provenance import is_unverified, registered_hashes
from trainer.registry import Registry

MIN_REWARD_COVERAGE = 0.5


# Exactly-once ingestion: one row per span (reward) of each Kafka record. A record twice in a table
# means a batch was committed twice; these checks are blocking, so such a run fails and nothing
# downstream is built from the duplicates. A client that re-sent a span (a retried OTLP export)
# puts it in another record: that is counted, not failed (trajectory assembly keeps one).
_ORIGIN = ["kafka_topic", "kafka_partition", "kafka_offset"]


def _unique(lake: LakeResource, table: str, key: list[str], redelivery_key: list[str]) -> AssetCheckResult:
    scan = lake.lake().scan(table)
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"rows": 0})
    counts = scan.select(
        pl.len().alias("rows"),
        pl.struct(*_ORIGIN, *key).n_unique().alias("unique"),
        pl.struct(*redelivery_key).n_unique().alias("distinct"),
    ).collect()
    rows, unique, distinct = (int(counts[c][0]) for c in ("rows", "unique", "distinct"))
    return AssetCheckResult(
        passed=rows == unique,
        metadata={"rows": rows, "duplicates": rows - unique, "redelivered": unique - distinct},
    )


@asset_check(
    asset=spans,
    blocking=True,
    description="Each span of each Kafka record is stored once (exactly-once ingestion); blocks downstream.",
)
def spans_unique(lake: LakeResource) -> AssetCheckResult:
    return _unique(lake, "spans", ["trace_id", "span_id"], ["tenant", "trace_id", "span_id"])


@asset_check(
    asset=rewards,
    blocking=True,
    description="Each reward of each Kafka record is stored once (exactly-once ingestion); blocks downstream.",
)
def rewards_unique(lake: LakeResource) -> AssetCheckResult:
    return _unique(lake, "rewards", ["source", "reward_id"], ["tenant", "source", "reward_id"])


def _first_rollout(scan: pl.LazyFrame, bad: pl.Expr, viewer: ViewerResource) -> dict[str, Any]:
    """The first rollout (by id) with a ``bad`` row, and a link to its page in the viewer: where to look first."""
    first = scan.filter(bad).select(pl.col("rollout_id").min()).collect()["rollout_id"][0]
    return {} if first is None else {"first_rollout": first, "first_rollout_page": viewer.link(f"/rollouts/{first}")}


@asset_check(asset=transitions, description="Response ids, logprobs and loss mask have the same length.")
def transitions_lengths(lake: LakeResource, viewer: ViewerResource) -> AssetCheckResult:
    scan = lake.lake().scan("transitions")
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"rows": 0})
    n = pl.col("response_ids").list.len()
    mismatched = (pl.col("loss_mask").list.len() != n) | (
        pl.col("response_logprobs").is_not_null() & (pl.col("response_logprobs").list.len() != n)
    )
    bad = scan.select(pl.len().alias("rows"), mismatched.sum().alias("bad")).collect()
    n_bad = int(bad["bad"][0])
    meta: dict[str, Any] = {"rows": int(bad["rows"][0]), "mismatched": n_bad}
    if n_bad:
        meta.update(_first_rollout(scan, mismatched, viewer))
    return AssetCheckResult(passed=n_bad == 0, metadata=meta)


@asset_check(asset=transitions, description="Every reward, return and advantage is a finite number.")
def transitions_finite(lake: LakeResource, viewer: ViewerResource) -> AssetCheckResult:
    scan = lake.lake().scan("transitions")
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"rows": 0})
    cols = ["reward", "return", "advantage"]
    non_finite = pl.any_horizontal([~pl.col(c).is_finite() for c in cols])
    bad = scan.select(non_finite.sum().alias("bad")).collect()
    n_bad = int(bad["bad"][0])
    meta: dict[str, Any] = {"non_finite": n_bad}
    if n_bad:
        meta.update(_first_rollout(scan, non_finite, viewer))
    return AssetCheckResult(passed=n_bad == 0, metadata=meta)


@asset_check(
    asset=transitions,
    description="Every adapter hash recorded with a transition is its version's registered hash (model_versions).",
)
def transitions_served_adapters_known(lake: LakeResource) -> AssetCheckResult:
    """Flag transitions whose (policy version, policy_sha256) the registry does not know (``trainer.provenance``).

    Such rows were sampled by files that are not the version they are named after: a replica that
    kept an old adapter under a new name, a version folder changed after registration, another
    lake's version. A WARN, not a failure: the rows are well-formed, the trainer already refuses them
    for its losses, and the fault is in serving, which blocking the lake would not repair (it would
    stop every other row from being built). The metadata names the pairs so the replica can be found.
    """
    the_lake = lake.lake()
    scan = the_lake.scan("transitions")
    if scan is None or "policy_sha256" not in scan.collect_schema().names():  # none yet, or from before v4
        return AssetCheckResult(passed=True, severity=AssetCheckSeverity.WARN, metadata={"rows_with_hash": 0})
    pairs = (
        scan.filter(pl.col("policy_sha256").is_not_null())
        .group_by("policy_version", "policy_sha256")
        .agg(pl.len().alias("rows"))
        .sort("policy_version", "policy_sha256")
        .collect()
    )
    registered = registered_hashes(Registry(the_lake).rows())
    unknown = [
        {"policy_version": pv, "policy_sha256": sha, "rows": n}
        for pv, sha, n in pairs.iter_rows()
        if is_unverified(pv, sha, registered)
    ]
    n_unknown = sum(u["rows"] for u in unknown)
    return AssetCheckResult(
        passed=n_unknown == 0,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "rows_with_hash": int(pairs["rows"].sum()) if pairs.height else 0,
            "unknown_rows": n_unknown,
            "unknown_pairs": MetadataValue.json(unknown),
        },
    )


@asset_check(
    asset=transitions,
    description="Share of the last run's LLM calls whose tokens mismatch the served model's (at most "
    "credit.max_token_mismatch_rate).",
)
def transitions_token_mismatch(context: AssetCheckExecutionContext, credit: CreditResource) -> AssetCheckResult:
    """Warn when the last `transitions` run found too many calls whose retokenized prompt is not what the
    served model renders (token_status "mismatch", `pipelines.gold.token_check`).

    Read from that run's materialization metadata, not the table: mismatched calls are left out of the
    table by default, so only the run that met them can count them. A WARN: the rows trained on are
    right; a high rate says the retokenizer's template is not the served model's (or messages are
    recorded in a shape it cannot render), so most messages-only calls are being lost."""
    event = context.instance.get_latest_materialization_event(transitions.key)
    mat = event.asset_materialization if event is not None else None
    meta = mat.metadata if mat is not None else {}
    counts = {s: int(getattr(meta.get(f"{TOKEN_STATUS_PREFIX}{s}"), "value", 0) or 0) for s in STATUSES}
    total = sum(counts.values())
    rate = counts[MISMATCH] / total if total else 0.0
    limit = credit.settings().max_token_mismatch_rate
    return AssetCheckResult(
        passed=rate <= limit,
        severity=AssetCheckSeverity.WARN,
        metadata={"calls": total, **counts, "mismatch_rate": round(rate, 4), "max_rate": limit},
    )


@asset_check(asset=trajectories, description="Share of ended trajectories that have a reward.")
def reward_coverage(lake: LakeResource) -> AssetCheckResult:
    scan = lake.lake().scan("trajectories")
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"ended": 0})
    c = (
        scan.filter(pl.col("status") != "running")
        .select(pl.len().alias("ended"), pl.col("final_reward").is_not_null().sum().alias("rewarded"))
        .collect()
    )
    ended, rewarded = int(c["ended"][0]), int(c["rewarded"][0])
    coverage = rewarded / ended if ended else 1.0
    return AssetCheckResult(
        passed=coverage >= MIN_REWARD_COVERAGE,
        severity=AssetCheckSeverity.WARN,
        metadata={"ended": ended, "rewarded": rewarded, "coverage": round(coverage, 4)},
    )


all_checks = [
    spans_unique,
    rewards_unique,
    transitions_lengths,
    transitions_finite,
    transitions_served_adapters_known,
    transitions_token_mismatch,
    reward_coverage,
]
