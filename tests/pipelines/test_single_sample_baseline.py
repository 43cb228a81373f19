"""The running baseline on single-sample traffic (issue 13): each task seen once, rewards late.

A rollout's advantage is its reward minus the running mean of its (tenant, agent), taken over the
rollouts whose rewards became known before its own (`pipelines.gold.credit`). That order is a property
of the events, not of the runs: when the lake fills in time order (a run sees everything up to its
moment), running the steps after every batch, however the batches fall, gives the transitions one
run over everything gives. Hypothesis draws the rollouts, their late rewards (or none) and the
batches; the lakes are real Delta tables fed as ingestion feeds them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from tempfile import TemporaryDirectory

import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipelines.gold.baselines import TenantBaselines
from pipelines.gold.transitions_step import saved_baseline, update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from schemas.config import CreditSettings
from tests.pipelines.test_identity import KAFKA
from tests.pipelines.test_reward_horizon import T0, Feed

SECOND = dt.timedelta(seconds=1)
COLUMNS = ["rollout_id", "agent_name", "reward", "reward_source", "baseline", "advantage"]

# (agent, start second, reward kind, reward value, reward delay in seconds)
rollouts = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.integers(0, 400),
        st.sampled_from(["span", "late", "late", "none"]),
        st.sampled_from([0.0, 0.25, 1.0, -1.0]),
        st.integers(1, 300),
    ),
    min_size=1,
    max_size=6,
)


def events(drawn: list[tuple[str, int, str, float, int]]) -> list[tuple[int, str, str, object]]:
    """The records in the order the lake receives them: a rollout when it ends, a late reward when decided."""
    out: list[tuple[int, str, str, object]] = []
    for i, (agent, start, kind, value, delay) in enumerate(drawn):
        out.append((start, "rollout", f"r{i}", (agent, value if kind == "span" else None)))
        if kind == "late":
            out.append((start + delay, "reward", f"r{i}", value))
    return sorted(out)


def feed(feed_: Feed, batch: list[tuple[int, str, str, object]]) -> None:
    for second, what, rid, payload in batch:
        at = T0 + second * SECOND
        if what == "rollout":
            agent, value = payload  # type: ignore[misc]
            feed_.rollout(rid, at, value, agent=agent)
        else:
            feed_.reward(rid, payload, at)  # type: ignore[arg-type]


def run(feed_: Feed, now: dt.datetime, chunk_rollouts: int = 10_000) -> None:
    update_trajectories(feed_.lake, KAFKA, idle_timeout_s=1e9, now=now)
    update_transitions(feed_.lake, feed_.credit, now=now, chunk_rollouts=chunk_rollouts)


def table(feed_: Feed) -> pl.DataFrame:
    rows = feed_.transitions()
    return rows.select(COLUMNS) if rows.height else pl.DataFrame()


def saved(feed_: Feed) -> str:
    return TenantBaselines.from_json(saved_baseline(feed_.lake)).to_json()


@pytest.mark.slow  # 12 examples of several incremental runs each: ~10 s
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=rollouts, cuts=st.lists(st.booleans(), min_size=12, max_size=12), horizon=st.sampled_from([None, 120]))
def test_incremental_runs_in_any_batches_equal_one_run_over_everything(
    drawn: list[tuple[str, int, str, float, int]], cuts: list[bool], horizon: int | None
) -> None:
    stream = events(drawn)
    seconds = [e[0] for e in stream]
    assume(len(set(seconds)) == len(seconds))  # two records of the same microsecond: no order to keep
    credit = CreditSettings(advantage="running_baseline", reward_horizon_s=horizon, missing_reward=0.5)
    with TemporaryDirectory() as tmp:
        incremental, rebuilt = Feed(Path(tmp) / "inc", credit), Feed(Path(tmp) / "all", credit)
        batch: list[tuple[int, str, str, object]] = []
        for k, event in enumerate(stream):
            batch.append(event)
            if k == len(stream) - 1 or cuts[k % len(cuts)]:
                feed(incremental, batch)
                run(incremental, T0 + (event[0] + 0.5) * SECOND)  # a run sees the data up to its moment
                batch = []
        end = T0 + (stream[-1][0] + 0.5) * SECOND
        feed(rebuilt, stream)
        run(rebuilt, end, chunk_rollouts=1)  # one run; a chunk per group: the chunks keep the order too
        assert table(incremental).equals(table(rebuilt), null_equal=True)
        assert saved(incremental) == saved(rebuilt)


def test_each_agent_has_its_own_baseline_in_the_order_rewards_became_known(tmp_path: Path) -> None:
    feed_ = Feed(tmp_path / "lake", CreditSettings(advantage="running_baseline"))
    feed_.rollout("r0", T0, agent="a")  # its reward comes last
    feed_.rollout("r1", T0 + 10 * SECOND, 1.0, agent="a")
    feed_.rollout("r2", T0 + 20 * SECOND, -4.0, agent="b")
    feed_.rollout("r3", T0 + 30 * SECOND, 0.0, agent="a")
    feed_.reward("r0", 0.5, T0 + 40 * SECOND)
    run(feed_, T0 + 50 * SECOND)
    rows = table(feed_).select("rollout_id", "baseline", "advantage").rows()
    # a: r1 (1.0), r3 (0.0) then r0 (0.5, known last); b's -4.0 never enters a's mean
    assert rows == [("r0", 0.5, 0.0), ("r1", 0.0, 1.0), ("r2", 0.0, -4.0), ("r3", 1.0, -1.0)]
    state = TenantBaselines.from_json(saved_baseline(feed_.lake))
    assert (state.of("default", "a").count, state.of("default", "b").count) == (3, 1)
