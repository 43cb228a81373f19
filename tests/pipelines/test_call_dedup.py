"""A call recorded twice (framework span with messages + the gateway's child span with ids) counts once."""

from __future__ import annotations

import datetime as dt

import polars as pl

from pipelines.silver.trajectories import assemble
from schemas.tables import SPANS
from schemas.validation import to_table

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def _span(span_id: str, parent: str | None, start_s: float, **cols: object) -> dict[str, object]:
    row: dict[str, object] = {f.name: None for f in SPANS}
    row.update(
        tenant="default",
        trace_id="a" * 32,
        span_id=span_id,
        parent_span_id=parent,
        name="span",
        start_time=T0 + dt.timedelta(seconds=start_s),
        end_time=T0 + dt.timedelta(seconds=start_s + 1),
        rollout_id="r1",
        task_id="t1",
        status_code="OK",
        day=T0.date(),
    )
    row.update(cols)
    return row


def test_framework_span_with_gateway_child_is_one_call() -> None:
    messages = '[{"role": "user", "content": "2+2?"}]'
    rows = [
        _span("0" * 16, None, 0, name="agentlake.rollout"),
        # call 1: the framework's span (messages only) and the gateway's child span (exact ids)
        _span("1" * 16, "0" * 16, 1, input_messages=messages, output_messages='[{"role":"assistant"}]'),
        _span("2" * 16, "1" * 16, 1.1, prompt_token_ids=[1, 2], completion_token_ids=[3], llm_response_id="c1"),
        # call 2: only a framework span (no gateway behind it) stays, to be retokenized
        _span("3" * 16, "0" * 16, 3, input_messages=messages, output_messages='[{"role":"assistant"}]'),
        _span("4" * 16, "0" * 16, 4, reward_value=1.0, reward_name="primary"),
    ]
    spans = pl.from_arrow(to_table(rows, SPANS))
    [row] = assemble(spans, now=T0 + dt.timedelta(minutes=1), idle_timeout_s=300).to_pylist()
    assert row["n_llm_calls"] == 2
    first, second = row["calls"]
    assert first["span_id"] == "2" * 16 and first["completion_token_ids"] == [3]
    assert second["span_id"] == "3" * 16 and second["completion_token_ids"] is None
    assert row["final_reward"] == 1.0
