"""The advantage-estimator registry: the gold step uses whatever estimator ``[credit] advantage`` names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from pipelines.gold.estimators import ESTIMATORS, EstimatorOptions, get_estimator, is_stateful, register
from schemas.config import CreditSettings
from tests.pipelines.test_chunks import build, records


@pytest.fixture
def median_estimator() -> Iterator[str]:
    """A group-median baseline, registered for the test only."""

    def median(rollouts: pl.DataFrame, group: list[str], opts: EstimatorOptions) -> pl.DataFrame:
        stats = rollouts.group_by(group).agg(pl.col("score").median().alias("_b"))
        return rollouts.join(stats, on=group).with_columns(pl.lit(1.0).alias("_s"))

    register("test_median")(median)
    try:
        yield "test_median"
    finally:
        ESTIMATORS.pop("test_median")


def test_the_gold_step_uses_a_registered_estimator(tmp_path: Path, median_estimator: str) -> None:
    # the settings' Literal does not know the test's name yet: set it past validation
    credit = CreditSettings().model_copy(update={"advantage": median_estimator})
    _, x, _, _ = build(tmp_path, records(), None, credit)
    assert x.height == 15 and set(x["advantage_mode"]) == {median_estimator}
    median = x.group_by("group_id").agg(pl.col("reward").median().alias("m"))
    got = (
        x.join(median, on="group_id")
        .select((pl.col("advantage") - (pl.col("reward") - pl.col("m"))).abs().max())
        .item()
    )
    assert got < 1e-12
    assert x.filter(pl.col("group_id") == "t4")["advantage"].sort().to_list() == [-0.5, -0.25, 0.0, 0.25, 0.5]


def test_the_built_in_estimators_are_registered_by_their_settings_names() -> None:
    assert set(ESTIMATORS) >= {"grpo", "rloo", "running_baseline", "none"}
    assert is_stateful("running_baseline") and not is_stateful("grpo") and not is_stateful("nope")
    with pytest.raises(ValueError, match="unknown advantage mode 'nope'"):
        get_estimator("nope")
