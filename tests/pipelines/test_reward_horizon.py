"""The reward horizon (issue 13): a finished rollout waits for its final reward until
`credit.reward_horizon_s` after its end, then is dropped or trained with `credit.missing_reward`;
a real reward that comes later replaces the default, and the running baseline counts it once.

Spans are made with the real OTel SDK, decoded as ingestion does and committed to a real Delta
`spans` table; reward events are decoded from the JSON the collector writes to the rewards topic
into `rewards`; the incremental steps run as the Dagster assets do.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.bronze.decoding.rewards import decode_reward_event
from pipelines.gold.baselines import TenantBaselines
from pipelines.gold.reward_horizon import horizon_due
from pipelines.gold.transitions_step import saved_baseline, update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from pipelines.steps import StepResult
from schemas.config import CreditSettings
from schemas.lake import Lake
from schemas.tables import REWARDS
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from tests.pipelines.test_identity import KAFKA

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


class Feed:
    """A lake fed one Kafka record at a time: rollouts to `spans`, reward events to `rewards`."""

    def __init__(self, root: Path, credit: CreditSettings) -> None:
        self.lake = Lake(str(root))
        self.credit = credit
        self.offsets = {"s": -1, "r": -1}

    def rollout(self, rid: str, at: dt.datetime, reward: float | None = None, *, agent: str = "solver") -> None:
        """A one-call rollout that starts at ``at`` (and ends a few ms later), with a reward span or none."""
        n = int(rid.strip("abcdefghijklmnopqrstuvwxyz_") or 0)
        call = Call(prompt=[1, n], response=[2, n], logprobs=[-0.5, -0.25])
        t0_ns = int(at.timestamp()) * 10**9
        r = Rollout(rid, task_id=f"task-{rid}", calls=[call], final_reward=reward, agent=agent, t0_ns=t0_ns)
        spans = make_spans(r)
        off = self.offsets["s"] = self.offsets["s"] + 1
        rec = KafkaRecord("s", 0, off, rid.encode(), encode(spans), [])
        self.lake.write("spans", decode_spans([rec])[0], txns={"kafka:s:0": off})

    def reward(self, rid: str, value: float, at: dt.datetime, name: str = "primary") -> None:
        """A late reward event from `/v1/rewards`, decided at ``at``."""
        off = self.offsets["r"] = self.offsets["r"] + 1
        body = {"rollout_id": rid, "value": value, "timestamp": at.isoformat(), "event_id": f"e-{rid}-{name}"}
        body["name"] = name
        row = decode_reward_event(KafkaRecord("r", 0, off, rid.encode(), json.dumps(body).encode(), []))
        self.lake.write("rewards", pa.Table.from_pylist([row], schema=REWARDS), txns={"kafka:r:0": off})

    def run(self, now: dt.datetime) -> StepResult:
        update_trajectories(self.lake, KAFKA, idle_timeout_s=1e9, now=now)
        return update_transitions(self.lake, self.credit, now=now)

    def transitions(self) -> pl.DataFrame:
        if self.lake.table("transitions") is None:
            return pl.DataFrame()
        return pl.read_delta(self.lake.uri("transitions")).sort("rollout_id", "step")

    def row(self, rid: str) -> dict[str, Any]:
        rows = self.transitions().filter(pl.col("rollout_id") == rid)
        assert rows.height == 1, rows
        return rows.row(0, named=True)


def test_without_a_horizon_a_rollout_waits_for_its_reward_forever(tmp_path: Path) -> None:
    feed = Feed(tmp_path / "lake", CreditSettings(missing_reward=0.0))
    feed.rollout("r1", T0)
    out = feed.run(T0 + 1000 * 24 * HOUR)
    assert out.extra["dropped_no_reward_waiting"] == 1 and feed.transitions().is_empty()
    assert "dropped_no_reward_expired" not in out.extra


def test_before_the_horizon_a_rollout_waits_and_after_it_is_dropped_once_with_no_new_data(tmp_path: Path) -> None:
    feed = Feed(tmp_path / "lake", CreditSettings(reward_horizon_s=3600))
    feed.rollout("r1", T0)
    waiting = feed.run(T0 + HOUR / 2)
    assert waiting.extra == {**waiting.extra, "dropped_no_reward_waiting": 1}
    assert "dropped_no_reward_expired" not in waiting.extra
    assert horizon_due(feed.lake, feed.credit, now=T0 + HOUR / 2) is None
    # nothing new arrives; the horizon passes: a sensor sees a run is due, and that run drops it
    due = horizon_due(feed.lake, feed.credit, now=T0 + 2 * HOUR)
    assert due == int((T0 + HOUR).timestamp() * 1e6)
    expired = feed.run(T0 + 2 * HOUR)
    assert horizon_due(feed.lake, feed.credit, now=T0 + 3 * HOUR) is None
    assert expired.extra["dropped_no_reward_expired"] == 1
    assert "dropped_no_reward_waiting" not in expired.extra and expired.rows == 0
    assert feed.transitions().is_empty()
    # and it is not reconsidered on every run after that
    later = feed.run(T0 + 3 * HOUR)
    assert later.extra == {} and later.version is None


def test_after_the_horizon_a_rollout_is_trained_with_the_default_reward_and_marked(tmp_path: Path) -> None:
    credit = CreditSettings(reward_horizon_s=3600, missing_reward=-0.5, advantage="none")
    feed = Feed(tmp_path / "lake", credit)
    feed.rollout("r1", T0)
    feed.rollout("r2", T0 + dt.timedelta(minutes=1), reward=1.0)
    feed.run(T0 + HOUR / 2)
    assert feed.transitions()["rollout_id"].to_list() == ["r2"]
    assert feed.row("r2")["reward_source"] == "span"
    out = feed.run(T0 + 2 * HOUR)  # no new data: the horizon alone
    assert out.extra["default_reward_rollouts"] == 1
    r1 = feed.row("r1")
    assert (r1["reward"], r1["return"], r1["reward_source"]) == (-0.5, -0.5, "default")
    assert feed.row("r2")["reward_source"] == "span"


def test_a_late_reward_replaces_the_default_and_the_running_baseline_counts_it_once(tmp_path: Path) -> None:
    credit = CreditSettings(reward_horizon_s=3600, missing_reward=0.0, advantage="running_baseline")
    feed = Feed(tmp_path / "lake", credit)
    feed.rollout("r0", T0, reward=1.0)
    feed.rollout("r1", T0 + dt.timedelta(minutes=1))
    feed.run(T0 + HOUR / 2)
    assert feed.row("r0")["baseline"] == 0.0
    feed.run(T0 + 2 * HOUR)  # r1 expires: trained with 0.0, compared with r0's 1.0
    r1 = feed.row("r1")
    assert (r1["reward"], r1["reward_source"], r1["baseline"], r1["advantage"]) == (0.0, "default", 1.0, -1.0)
    saved = TenantBaselines.from_json(saved_baseline(feed.lake)).of("default", "solver")
    assert saved.count == 1  # a default reward is compared with the baseline but never moves it

    # r2 is counted while r1 still holds the default
    feed.rollout("r2", T0 + 3 * HOUR, reward=0.0)
    feed.run(T0 + 3 * HOUR + HOUR / 2)
    assert feed.row("r2")["baseline"] == 1.0
    assert feed.row("r1")["baseline"] == 1.0  # recomputed groups keep what r1 was compared with

    # the real reward comes a day late: r1's row is replaced, and it is counted now, once
    feed.reward("r1", 0.5, T0 + 24 * HOUR)
    feed.run(T0 + 25 * HOUR)
    r1 = feed.row("r1")
    assert (r1["reward"], r1["reward_source"]) == (0.5, "event")
    assert r1["baseline"] == 0.5 and r1["advantage"] == 0.0  # the mean of r0 and r2, before r1
    saved = TenantBaselines.from_json(saved_baseline(feed.lake)).of("default", "solver")
    assert (saved.count, saved.value) == (3, 0.5)
    again = feed.run(T0 + 26 * HOUR)
    assert again.version is None
    feed.reward("r1", 0.5, T0 + 24 * HOUR)  # the same event delivered twice: its group is built again
    feed.run(T0 + 27 * HOUR)
    assert feed.row("r1")["baseline"] == 0.5
    saved = TenantBaselines.from_json(saved_baseline(feed.lake)).of("default", "solver")
    assert saved.count == 3


def test_a_real_reward_that_arrives_in_time_is_used_and_nothing_expires(tmp_path: Path) -> None:
    feed = Feed(tmp_path / "lake", CreditSettings(reward_horizon_s=3600, missing_reward=0.0))
    feed.rollout("r1", T0)
    feed.run(T0 + HOUR / 2)
    feed.reward("r1", 1.0, T0 + HOUR / 2)
    feed.run(T0 + HOUR * 3 / 4)
    assert feed.row("r1")["reward_source"] == "event" and feed.row("r1")["reward"] == 1.0
    out = feed.run(T0 + 2 * HOUR)  # past the horizon: nothing to pick up
    assert out.version is None


def test_a_rollout_whose_spans_come_after_its_horizon_is_defaulted_at_once(tmp_path: Path) -> None:
    feed = Feed(tmp_path / "lake", CreditSettings(reward_horizon_s=3600, missing_reward=0.0))
    feed.rollout("r1", T0)
    feed.run(T0 + 5 * HOUR)
    assert feed.row("r1")["reward_source"] == "default"


def test_a_transitions_table_from_before_reward_source_gains_the_column(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    credit = CreditSettings(advantage="running_baseline", reward_horizon_s=3600, missing_reward=0.0)
    feed = Feed(tmp_path / "lake", credit)
    feed.rollout("r0", T0, reward=1.0)
    feed.run(T0 + HOUR / 2)
    v2 = feed.lake.table("transitions").to_pyarrow_table().drop_columns(["reward_source"])  # type: ignore[union-attr]
    write_deltalake(feed.lake.uri("transitions"), v2, mode="overwrite", schema_mode="overwrite", partition_by=["day"])
    feed.rollout("r0", T0 + HOUR, reward=0.0)  # r0's group again: its row from before keeps its baseline
    feed.rollout("r1", T0 + HOUR)
    feed.run(T0 + 3 * HOUR)
    assert feed.transitions().select("rollout_id", "reward_source", "baseline").rows() == [
        ("r0", "span", 0.0),
        ("r1", "default", 1.0),
    ]


def test_the_reward_source_is_that_of_the_reward_credit_chose(tmp_path: Path) -> None:
    from pipelines.gold.transitions import build
    from pipelines.silver.identity import resolve_rollouts
    from pipelines.silver.trajectories import assemble

    feed = Feed(tmp_path / "lake", CreditSettings())
    feed.rollout("r1", T0, reward=1.0)  # a primary reward span
    feed.reward("r1", 0.25, T0 + HOUR, name="judge")
    spans = resolve_rollouts(pl.read_delta(feed.lake.uri("spans")))
    events = pl.read_delta(feed.lake.uri("rewards"))
    for chosen, reward, source in [(None, 1.0, "span"), ("judge", 0.25, "event")]:
        traj = pl.from_arrow(assemble(spans, events, now=T0 + 2 * HOUR, idle_timeout_s=1e9, reward_name=chosen))
        assert isinstance(traj, pl.DataFrame)
        out = pl.from_arrow(build(traj, CreditSettings(reward=chosen), now=T0 + 2 * HOUR).table)
        assert isinstance(out, pl.DataFrame)
        assert out.select("reward", "reward_source").rows() == [(reward, source)]
