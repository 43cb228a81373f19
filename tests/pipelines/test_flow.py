"""OTel SDK spans -> Kafka -> Dagster assets -> Delta, on a real broker and real Delta tables."""

from __future__ import annotations

import polars as pl
import pytest
from dagster import DagsterInstance, build_sensor_context, materialize
from typer.testing import CliRunner

from pipelines.defs.assets import all_assets
from pipelines.defs.automation import kafka_sensor
from pipelines.defs.checks import all_checks
from pipelines.defs.resources import resources_from_settings
from pipelines.gold.transitions import build
from pipelines.lake.query import list_tables, run_query
from pipelines.lake.replay import replay
from pipelines.silver.trajectories import TERMINAL
from schemas.config import CreditSettings, Settings
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, produce, reward_record, span_record

pytestmark = pytest.mark.kafka

SD = 0.5  # sample std of {1, 0, 0.5}


def run(settings: Settings) -> dict[str, dict[str, object]]:
    """Materialize every asset and check in process; return each asset's metadata."""
    result = materialize([*all_assets, *all_checks], resources=resources_from_settings(settings))
    assert result.success
    for ev in result.get_asset_check_evaluations():
        assert ev.passed, ev
    return {
        mat.asset_key.path[-1]: {k: v.value for k, v in mat.metadata.items()}
        for mat in result.get_asset_materialization_events()
        for mat in [mat.event_specific_data.materialization]  # type: ignore[union-attr]
    }


def two_calls(i: int) -> list[Call]:
    return [
        Call(prompt=[1, 2, 3], response=[10 + i, 11], logprobs=[-0.1, -0.2]),
        Call(prompt=[1, 2, 3, 10 + i, 11, 7], response=[12], logprobs=[-0.3], reward_after=None),
    ]


def lake_of(settings: Settings) -> Lake:
    return Lake(settings.lake.root)


def table(lake: Lake, name: str) -> pl.DataFrame:
    return pl.read_delta(lake.uri(name))


def test_otel_spans_to_transitions(settings: Settings, tmp_path) -> None:
    k = settings.kafka
    rollouts = [Rollout(f"r{i}", task_id="sum", calls=two_calls(i), final_reward=r) for i, r in enumerate([1, 0, 0.5])]
    running = Rollout("r-running", task_id="sum", calls=two_calls(9), final_reward=None, end_root=False)
    records = [span_record(make_spans(r), key=r.rollout_id) for r in [*rollouts, running]]
    records.append({"key": b"junk", "value": b"\x00not protobuf", "headers": []})
    produce(k, k.spans_topic, records)

    # the sensor sees new records and asks for a run
    res = resources_from_settings(settings)
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(
            instance=instance, resources={"kafka": res["kafka"], "lake": res["lake"], "credit": res["credit"]}
        )
        first = kafka_sensor(ctx)
        assert first.run_requests, "new records must start ingestion"

    meta = run(settings)
    assert meta["spans"]["rows"] == sum(len(make_spans(r)) for r in [*rollouts, running])
    assert meta["spans"]["quarantined"] == 1
    lake = lake_of(settings)
    q = table(lake, "quarantine")
    assert q["kafka_topic"].to_list() == [k.spans_topic] and "DecodeError" in q["error"][0]

    traj = table(lake, "trajectories").sort("rollout_id")
    assert traj["rollout_id"].to_list() == ["r-running", "r0", "r1", "r2"]
    assert traj["status"].to_list() == ["running", "finished", "finished", "finished"]
    assert traj["final_reward"].to_list()[1:] == [1.0, 0.0, 0.5]
    assert traj["n_llm_calls"].to_list() == [2, 2, 2, 2]

    tr = table(lake, "transitions").sort("rollout_id", "step")
    assert tr.height == 6 and set(tr["token_source"]) == {"exact"}
    assert tr["prompt_ids"][1].to_list() == [1, 2, 3, 10, 11, 7]
    assert tr["response_logprobs"][0].to_list() == pytest.approx([-0.1, -0.2])
    assert tr["loss_mask"][0].to_list() == [1, 1]
    mean = 0.5
    expect = [(r - mean) / SD for r in (1, 1, 0, 0, 0.5, 0.5)]
    assert tr["advantage"].to_list() == pytest.approx(expect, abs=1e-4)
    assert tr["reward"].to_list() == [1, 1, 0, 0, 0.5, 0.5]
    assert meta["transitions"]["reward_mean"] == pytest.approx(0.5)

    # after ingestion the sensor has nothing new to ask for
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(
            instance=instance,
            cursor=first.cursor,
            resources={"kafka": res["kafka"], "lake": res["lake"], "credit": res["credit"]},
        )
        assert not kafka_sensor(ctx).run_requests

    # a late reward (by rollout id) re-scores r1 in a new table version; one by trace id ends nothing new
    v_before = lake.version("trajectories")
    produce(
        k,
        k.rewards_topic,
        [reward_record({"rollout_id": "r1", "value": 1.0, "event_id": "late-1"}), reward_record({"value": "x"})],
    )
    meta = run(settings)
    assert meta["rewards"]["quarantined"] == 1
    assert lake.version("trajectories") > v_before
    traj = table(lake, "trajectories").sort("rollout_id")
    assert traj.filter(pl.col("rollout_id") == "r1")["final_reward"].to_list() == [1.0]
    tr = table(lake, "transitions").sort("rollout_id", "step")
    assert tr["reward"].to_list() == [1, 1, 1, 1, 0.5, 0.5]
    assert tr.height == 6  # replaced, not appended
    # response-id resolution: a reward naming an LLM response finds its rollout
    produce(k, k.rewards_topic, [reward_record({"response_id": "resp-r2-None-1", "value": 0.0, "event_id": "e2"})])
    run(settings)
    assert table(lake, "trajectories").filter(pl.col("rollout_id") == "r2")["final_reward"].to_list() == [0.0]

    # query: DuckDB views named as the tables, CLI included
    counts = run_query(lake, "SELECT count(*) AS n FROM transitions").to_pylist()
    assert counts == [{"n": 6}]
    infos = {t.name: t for t in list_tables(lake)}
    assert infos["spans"].rows == meta_rows(lake) and infos["transitions"].version is not None
    from agentlake.cli import app

    cli = CliRunner().invoke(
        app,
        ["query", "SELECT rollout_id, avg(reward) AS r FROM transitions GROUP BY 1 ORDER BY 1", "-f", "csv"],
        env={"AGENTLAKE_LAKE": settings.lake.root},
    )
    assert cli.exit_code == 0, cli.output
    assert cli.output.splitlines()[:2] == ["rollout_id,r", "r0,1.0"]
    cli = CliRunner().invoke(app, ["tables"], env={"AGENTLAKE_LAKE": settings.lake.root})
    assert cli.exit_code == 0 and "transitions" in cli.output

    # replay: a fresh lake rebuilt from Kafka holds the same rows
    fresh = Lake(str(tmp_path / "replayed"))
    replay(settings, fresh)
    for name, key, drop in [
        ("spans", ["trace_id", "span_id"], []),
        ("trajectories", ["rollout_id"], ["updated_at"]),
        ("transitions", ["transition_id"], ["created_at"]),
        ("quarantine", ["kafka_topic", "kafka_offset"], ["quarantined_at"]),
    ]:
        a = table(lake, name).drop(drop).sort(key)
        b = table(fresh, name).drop(drop).sort(key)
        assert a.equals(b), name


def meta_rows(lake: Lake) -> int:
    return table(lake, "spans").height


@pytest.mark.parametrize(
    ("mode", "gamma", "rewards", "returns"),
    [
        ("identical", 1.0, [1, 1], [1, 1]),
        ("last_only", 1.0, [0, 1], [0, 1]),
        ("discounted", 0.5, [0, 1], [0.5, 1]),
        ("per_step", 0.5, [0.25, 1], [0.75, 1]),
    ],
)
def test_credit_modes_on_real_trajectories(
    settings: Settings, mode: str, gamma: float, rewards: list[float], returns: list[float]
) -> None:
    """One rollout with an intermediate reward (0.25 after call 0) and a final reward 1."""
    k = settings.kafka
    calls = two_calls(0)
    calls[0].reward_after = 0.25
    calls[0].policy_version = "v1"
    r = Rollout("solo", task_id=None, calls=calls, final_reward=1.0)
    produce(k, k.spans_topic, [span_record(make_spans(r))])
    run(settings)
    traj = table(lake_of(settings), "trajectories")
    assert traj["status"].to_list() == ["finished"] and traj["final_reward"].to_list() == [1.0]
    assert traj["policy_versions"].to_list() == [["v1", "v0"]]
    credit = CreditSettings(mode=mode, gamma=gamma, advantage="none")  # type: ignore[arg-type]
    out = build(traj, credit, now=traj["updated_at"][0]).table
    got = pl.from_arrow(out).sort("step")
    assert got["reward"].to_list() == pytest.approx(rewards)
    assert got["return"].to_list() == pytest.approx(returns)
    assert got["group_id"].to_list() == ["solo", "solo"]
    assert set(TERMINAL) >= set(traj["status"])


def run_unrewarded(settings: Settings) -> None:
    """Materialize everything; the reward-coverage check warns here (a rollout without reward is the point)."""
    result = materialize([*all_assets, *all_checks], resources=resources_from_settings(settings))
    assert result.success
    failed = {ev.check_name for ev in result.get_asset_check_evaluations() if not ev.passed}
    assert failed <= {"reward_coverage"}, failed


@pytest.mark.slow  # waits out a reward horizon through the sensor: ~10 s
def test_the_sensor_runs_the_lake_when_a_reward_horizon_passes_without_new_records(settings: Settings) -> None:
    """A rollout that never gets its reward is settled when its horizon passes, though no record arrives."""
    settings.credit.reward_horizon_s = 5.0
    settings.credit.missing_reward = 0.0
    k = settings.kafka
    old = Rollout("r-quiet", task_id="t", calls=two_calls(1), final_reward=None, t0_ns=1_700_000_000 * 10**9)
    produce(k, k.spans_topic, [span_record(make_spans(old), key=old.rollout_id)])
    res = resources_from_settings(settings)
    resources = {"kafka": res["kafka"], "lake": res["lake"], "credit": res["credit"]}
    with DagsterInstance.ephemeral() as instance:
        first = kafka_sensor(build_sensor_context(instance=instance, resources=resources))
        assert [r.run_key for r in first.run_requests] and not first.run_requests[0].run_key.startswith("horizon")
    run_unrewarded(settings)  # ingests; the rollout ended long ago, so this very run settles it with the default reward
    assert table(lake_of(settings), "transitions")["reward_source"].to_list() == ["default", "default"]
    with DagsterInstance.ephemeral() as instance:
        again = kafka_sensor(build_sensor_context(instance=instance, cursor=first.cursor, resources=resources))
        assert not again.run_requests, "settled once, nothing due"

    # Without a horizon at ingestion time it waits; a horizon set later makes the sensor ask for a run
    later = settings.model_copy(deep=True)
    later.lake.root = settings.lake.root + "-2"
    later.credit.reward_horizon_s = None
    run_unrewarded(later)
    assert lake_of(later).table("transitions") is None or table(lake_of(later), "transitions").height == 0
    later.credit.reward_horizon_s = 5.0
    res2 = resources_from_settings(later)
    resources2 = {"kafka": res2["kafka"], "lake": res2["lake"], "credit": res2["credit"]}
    with DagsterInstance.ephemeral() as instance:
        seen = kafka_sensor(build_sensor_context(instance=instance, resources=resources2)).cursor
        due = kafka_sensor(build_sensor_context(instance=instance, cursor=seen, resources=resources2))
        assert [r.run_key[:8] for r in due.run_requests] == ["horizon-"]
    run_unrewarded(later)
    assert table(lake_of(later), "transitions")["reward_source"].to_list() == ["default", "default"]
