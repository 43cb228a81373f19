"""Asset checks: the invariants the trainer relies on, evaluated on the tables as written."""

import polars as pl
from dagster import AssetCheckResult, AssetCheckSeverity, asset_check

from pipelines.assets import spans, trajectories, transitions
from pipelines.resources import LakeResource

MIN_REWARD_COVERAGE = 0.5


@asset_check(asset=spans, description="A span id appears once per trace (exactly-once ingestion).")
def spans_unique(lake: LakeResource) -> AssetCheckResult:
    scan = lake.lake().scan("spans")
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"rows": 0})
    counts = scan.select(pl.len().alias("rows"), pl.struct("trace_id", "span_id").n_unique().alias("unique")).collect()
    rows, unique = int(counts["rows"][0]), int(counts["unique"][0])
    return AssetCheckResult(passed=rows == unique, metadata={"rows": rows, "duplicates": rows - unique})


@asset_check(asset=transitions, description="Response ids, logprobs and loss mask have the same length.")
def transitions_lengths(lake: LakeResource) -> AssetCheckResult:
    scan = lake.lake().scan("transitions")
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"rows": 0})
    n = pl.col("response_ids").list.len()
    bad = scan.select(
        pl.len().alias("rows"),
        (
            (pl.col("loss_mask").list.len() != n)
            | (pl.col("response_logprobs").is_not_null() & (pl.col("response_logprobs").list.len() != n))
        )
        .sum()
        .alias("bad"),
    ).collect()
    return AssetCheckResult(
        passed=int(bad["bad"][0]) == 0, metadata={"rows": int(bad["rows"][0]), "mismatched": int(bad["bad"][0])}
    )


@asset_check(asset=transitions, description="Every reward, return and advantage is a finite number.")
def transitions_finite(lake: LakeResource) -> AssetCheckResult:
    scan = lake.lake().scan("transitions")
    if scan is None:
        return AssetCheckResult(passed=True, metadata={"rows": 0})
    cols = ["reward", "return", "advantage"]
    bad = scan.select(pl.any_horizontal([~pl.col(c).is_finite() for c in cols]).sum().alias("bad")).collect()
    n_bad = int(bad["bad"][0])
    return AssetCheckResult(passed=n_bad == 0, metadata={"non_finite": n_bad})


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


all_checks = [spans_unique, transitions_lengths, transitions_finite, reward_coverage]
