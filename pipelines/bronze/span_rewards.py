"""Reward spans copied from `spans` into `rewards`, exactly once per spans partition offset."""

from __future__ import annotations

import polars as pl

from pipelines.bronze.decoding import reward_rows_from_spans
from pipelines.bronze.positions import app_id
from schemas.lake import Lake, unseen_offsets


def span_rewards_app_id(topic: str, partition: int) -> str:
    return f"spans:{topic}:{partition}"


def extract_span_rewards(lake: Lake, spans_topic: str) -> int:
    """Copy reward spans from `spans` into `rewards`, exactly once per spans partition offset."""
    spans = lake.table("spans")
    if spans is None:
        return 0
    # read and committed on one snapshot: a concurrent copy of the same range makes this one fail
    target = lake.pin("rewards")
    cond, txns = unseen_offsets(
        spans,
        spans_topic,
        watermark=lambda p: app_id(spans_topic, p),
        seen=lambda p: target.transaction_version(span_rewards_app_id(spans_topic, p)),
        seen_app=lambda p: span_rewards_app_id(spans_topic, p),
    )
    if cond is None:
        return 0
    rows = pl.scan_delta(spans).filter(pl.col("reward_value").is_not_null()).filter(cond).collect().to_arrow()
    data = reward_rows_from_spans(rows)
    expect = {a: target.transaction_version(a) for a in txns}
    lake.write("rewards", data, txns=txns, snapshot=target, expect=expect)
    return data.num_rows
