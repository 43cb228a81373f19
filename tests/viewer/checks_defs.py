"""A small Dagster code location for the health page's check test: one asset, a check that passes and one that
warns, so a real webserver has results of both kinds to answer with."""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSeverity, Definitions, MetadataValue, asset, asset_check


@asset
def lake_rows() -> int:
    return 3


@asset_check(asset=lake_rows, description="Every row has a tenant.")
def rows_have_tenants() -> AssetCheckResult:
    return AssetCheckResult(passed=True, metadata={"rows": 3})


@asset_check(asset=lake_rows, description="Rewards are not all the same.")
def rewards_vary() -> AssetCheckResult:
    return AssetCheckResult(
        passed=False,
        severity=AssetCheckSeverity.WARN,
        description="one distinct reward",
        metadata={"distinct": 1, "viewer": MetadataValue.url("http://127.0.0.1:8000/health")},
    )


defs = Definitions(assets=[lake_rows], asset_checks=[rows_have_tenants, rewards_vary])
