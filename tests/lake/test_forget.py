"""`agentlake forget` on real Delta tables: the right rows go from every table, other tenants' stay,
the files that held them are gone from disk, the deletion is recorded, and a rebuild from Kafka
(replay) does not bring them back."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyarrow.fs import FileSelector
from typer.testing import CliRunner

from agentlake.cli import app
from pipelines.lake.forget import (
    DELETION_KEY,
    FORGET_TABLES,
    Selector,
    UnknownTenantError,
    execute,
    forget,
    frames_of,
    plan,
)
from schemas import topics
from schemas.config import Settings
from schemas.lake import Lake
from schemas.storage import filesystem
from schemas.tables import TABLES
from tests.objectstore import ObjectStore

T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


# --- rows ----------------------------------------------------------------------------------------
def span(tenant: str, rollout: str, trace: str, sid: str, start: dt.datetime, offset: int, **kw: Any) -> dict:
    return {
        "tenant": tenant,
        "trace_id": trace,
        "span_id": sid,
        "name": "llm.call",
        "start_time": start,
        "rollout_id": rollout,
        "input_messages": json.dumps([{"role": "user", "content": f"secret of {tenant}/{rollout}"}]),
        "attributes": "{}",
        "kafka_topic": "spans",
        "kafka_partition": 0,
        "kafka_offset": offset,
        "day": start.date(),
        **kw,
    }


def reward(tenant: str, rid: str, when: dt.datetime, **kw: Any) -> dict:
    return {
        "reward_id": rid,
        "source": "event",
        "tenant": tenant,
        "name": "primary",
        "value": 1.0,
        "event_time": when,
        "day": when.date(),
        **kw,
    }


def trajectory(tenant: str, rollout: str, traces: list[str], start: dt.datetime) -> dict:
    return {
        "rollout_id": rollout,
        "tenant": tenant,
        "trace_ids": traces,
        "status": "finished",
        "start_time": start,
        "calls": [{"span_id": "x", "input_messages": f"secret of {tenant}/{rollout}"}],
        "updated_at": start,
        "day": start.date(),
    }


def transition(tenant: str, rollout: str, step: int, start: dt.datetime) -> dict:
    return {
        "transition_id": f"{rollout}/None/{step}",
        "rollout_id": rollout,
        "tenant": tenant,
        "group_id": rollout,
        "step": step,
        "prompt_ids": [1, 2],
        "response_ids": [3],
        "loss_mask": [1],
        "reward": 1.0,
        "return": 1.0,
        "advantage": 0.0,
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "created_at": start,
        "day": start.date(),
    }


def lineage(rollout: str, step: int) -> dict:
    return {
        "model_version": "v0001",
        "transition_id": f"{rollout}/None/{step}",
        "rollout_id": rollout,
        "train_table": "transitions",
        "table_version": 1,
        "consumed_at": T0,
    }


def quarantined(tenant: str, key: str, offset: int, received: dt.datetime = T0) -> dict:
    headers = {topics.HEADER_TENANT: tenant, topics.HEADER_RECEIVED_AT: str(int(received.timestamp() * 1e9))}
    return {
        "kafka_topic": "spans",
        "kafka_partition": 0,
        "kafka_offset": offset,
        "key": key.encode(),
        "value": b"\x00junk",
        "headers": json.dumps(headers),
        "error": "DecodeError",
        "quarantined_at": received,
    }


def put(lake: Lake, name: str, rows: list[dict]) -> None:
    lake.write(name, pa.Table.from_pylist(rows, schema=TABLES[name]))


def two_tenant_lake(root: Path | Lake) -> Lake:
    """Tenants a and b; both have a rollout named r1 (ids are only unique within a tenant).

    a/r1 is trace ta1 plus the gateway's record of its call in trace ta1g (joined by response id),
    with rewards that name it by rollout, by trace only and by response id only.
    """
    lake = root if isinstance(root, Lake) else Lake(str(root))
    # two commits, each mixing tenants, then compacted: the pre-compaction files stay on disk
    put(
        lake,
        "spans",
        [
            span("a", "r1", "ta1", "s1", T0, 0, llm_response_id="resp-a1"),
            span("a", "r2", "ta2", "s2", T0 + DAY, 1),
            span("b", "r1", "tb1", "s3", T0, 2, llm_response_id="resp-b1"),
        ],
    )
    put(
        lake,
        "spans",
        [
            span("a", "r1", "ta1", "s4", T0, 3),
            span("a", "ta1g", "ta1g", "s5", T0, 4, llm_response_id="resp-a1", service_name="agentlake-gateway"),
            span("b", "r1", "tb1", "s6", T0, 5),
        ],
    )
    lake.compact("spans")
    put(
        lake,
        "rewards",
        [
            reward("a", "e1", T0, rollout_id="r1"),
            reward("a", "e2", T0, trace_id="ta1"),
            reward("a", "e3", T0, llm_response_id="resp-a1"),
            reward("a", "e4", T0 + DAY, rollout_id="r2"),
            reward("b", "e5", T0, rollout_id="r1"),
            reward("b", "e6", T0, llm_response_id="resp-b1"),
        ],
    )
    put(
        lake,
        "trajectories",
        [
            trajectory("a", "r1", ["ta1", "ta1g"], T0),
            trajectory("a", "r2", ["ta2"], T0 + DAY),
            trajectory("b", "r1", ["tb1"], T0),
        ],
    )
    put(
        lake,
        "transitions",
        [
            transition("a", "r1", 0, T0),
            transition("a", "r1", 1, T0),
            transition("a", "r2", 0, T0 + DAY),
            transition("b", "r1", 0, T0),
        ],
    )
    put(lake, "training_lineage", [lineage("r1", 0), lineage("r1", 1), lineage("r2", 0)])
    put(lake, "quarantine", [quarantined("a", "r1", 6), quarantined("b", "r1", 7), quarantined("a", "other", 8)])
    return lake


def rows(lake: Lake, name: str) -> pl.DataFrame:
    scan = lake.scan(name)
    assert scan is not None, f"no {name} table"
    return scan.collect()


def counts(lake: Lake) -> dict[str, int]:
    return {name: rows(lake, name).height if lake.table(name) else 0 for name in FORGET_TABLES}


def said(result: Any) -> str:
    """The command's output as one line of words (rich wraps lines and draws boxes)."""
    return " ".join(result.output.replace("│", " ").split())


def on_disk(lake: Lake, name: str) -> pl.DataFrame:
    """Every row of every data file under the table's folder (or prefix): live, tombstoned or orphaned."""
    fs, base = filesystem(lake.uri(name), lake.storage_options)
    files = sorted(f.path for f in fs.get_file_info(FileSelector(base, recursive=True)) if f.path.endswith(".parquet"))
    frames = []
    for f in files:
        t = pq.read_table(f, filesystem=fs)
        frames.append(pl.from_arrow(t.select([c for c in ("tenant", "rollout_id", "trace_id") if c in t.column_names])))
    return pl.concat(frames, how="diagonal") if frames else pl.DataFrame()


def cli(root: Path, *args: str) -> Any:
    env = {"AGENTLAKE_LAKE": str(root), "AGENTLAKE_STATE_DIR": str(root.parent / "state")}
    return CliRunner().invoke(app, ["forget", *args], env=env)


# --- tests ---------------------------------------------------------------------------------------
def test_forget_one_rollout_with_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = two_tenant_lake(root)
    before = counts(lake)
    versions = {n: lake.version(n) for n in FORGET_TABLES}
    assert on_disk(lake, "spans").filter((pl.col("tenant") == "a") & (pl.col("rollout_id") == "r1")).height == 4

    res = cli(root, "--tenant", "a", "--rollout", "r1", "--yes", "--by", "dpo@example.org", "--reason", "GDPR art. 17")
    assert res.exit_code == 0, res.output
    assert "forgot tenant a: rollout r1: 10 rows" in said(res)

    # a/r1 is gone everywhere: both its traces (the gateway's joined by response id) and every reward naming it
    assert sorted(rows(lake, "spans")["span_id"]) == ["s2", "s3", "s6"]
    assert sorted(rows(lake, "rewards")["reward_id"]) == ["e4", "e5", "e6"]
    traj = rows(lake, "trajectories")
    assert sorted(zip(traj["tenant"], traj["rollout_id"], strict=True)) == [("a", "r2"), ("b", "r1")]
    trans = rows(lake, "transitions")
    assert sorted(zip(trans["tenant"], trans["transition_id"], strict=True)) == [("a", "r2/None/0"), ("b", "r1/None/0")]
    # lineage has no tenant column: b's rollout is also named r1, so those rows stay
    assert rows(lake, "training_lineage").height == 3
    q = rows(lake, "quarantine")
    assert sorted(q["kafka_offset"]) == [7, 8]
    after = counts(lake)
    removed = {n: before[n] - after[n] for n in FORGET_TABLES}
    assert removed == {
        "spans": 3,
        "rewards": 3,
        "trajectories": 1,
        "transitions": 2,
        "training_lineage": 0,
        "quarantine": 1,
        "judgements": 0,  # none judged here: tests/pipelines/test_judge.py forgets a judged rollout
    }

    # recorded: who, what, when, rows and versions per table
    rec = rows(lake, "deletions").to_dicts()
    assert len(rec) == 1
    r = rec[0]
    assert (r["kind"], r["tenant"], r["rollout_id"], r["before"]) == ("forget", "a", "r1", None)
    assert (r["requested_by"], r["reason"], r["rows_removed"]) == ("dpo@example.org", "GDPR art. 17", 10)
    per_table = {x["table"]: (x["rows"], x["version"]) for x in r["removed"]}
    assert {t: n for t, (n, _) in per_table.items()} == {t: n for t, n in removed.items() if n}
    for t, (_, version) in per_table.items():  # the version of the delete itself (the vacuum commits after it)
        commit = next(c for c in lake.table(t).history() if c["version"] == version)  # type: ignore[union-attr]
        assert version > versions[t] and commit["operation"] == "DELETE", commit
        assert commit[DELETION_KEY] == r["deletion_id"]
    assert r["deleted_at"] is not None

    # the data files that held a/r1 (the delete's inputs, the pre-compaction files) are gone from disk
    for name in ("spans", "rewards", "trajectories", "transitions"):
        disk = on_disk(lake, name)
        assert disk.filter((pl.col("tenant") == "a") & (pl.col("rollout_id") == "r1")).height == 0, name
        assert disk.filter(pl.col("tenant") == "b").height == rows(lake, name).filter(pl.col("tenant") == "b").height
    assert on_disk(lake, "spans").filter(pl.col("trace_id") == "ta1g").height == 0
    # b's rows are untouched, values included
    assert (
        rows(lake, "spans").filter(pl.col("tenant") == "b")["input_messages"].to_list()
        == [json.dumps([{"role": "user", "content": "secret of b/r1"}])] * 2
    )


def test_forget_a_tenant_before_a_date_with_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = Lake(str(root))
    jan = lambda d: dt.datetime(2026, 1, d, 12, tzinfo=dt.UTC)  # noqa: E731
    put(
        lake,
        "spans",
        [
            span("a", "old", "t-old", "s1", jan(5), 0),
            span("a", "straddle", "t-str", "s2", jan(9), 1),
            span("a", "straddle", "t-str", "s3", jan(11), 2),  # after the cutoff, but its rollout began before
            span("a", "new", "t-new", "s4", jan(15), 3),
            span("b", "old", "t-b", "s5", jan(5), 4),
        ],
    )
    put(
        lake,
        "rewards",
        [
            reward("a", "e-ghost", jan(6), rollout_id="ghost"),  # names no rollout we hold: gone by its time
            reward("a", "e-str", jan(12), rollout_id="straddle"),
            reward("a", "e-new", jan(15), rollout_id="new"),
            reward("b", "e-b", jan(5), rollout_id="old"),
        ],
    )
    put(
        lake,
        "trajectories",
        [
            trajectory("a", "old", ["t-old"], jan(5)),
            trajectory("a", "straddle", ["t-str"], jan(9)),
            trajectory("a", "new", ["t-new"], jan(15)),
            trajectory("b", "old", ["t-b"], jan(5)),
        ],
    )
    put(lake, "transitions", [transition("a", r, 0, jan(d)) for r, d in [("old", 5), ("straddle", 9), ("new", 15)]])
    put(lake, "transitions", [transition("b", "old", 0, jan(5))])
    put(lake, "quarantine", [quarantined("a", "x", 5, jan(3)), quarantined("a", "y", 6, jan(20))])
    before = counts(lake)

    dry = cli(root, "--tenant", "a", "--before", "2026-01-10", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run" in said(dry) and counts(lake) == before and lake.table("deletions") is None

    res = cli(root, "--tenant", "a", "--before", "2026-01-10", "--yes")
    assert res.exit_code == 0, res.output
    a_left = {n: sorted(set(rows(lake, n).filter(pl.col("tenant") == "a")["rollout_id"])) for n in FORGET_TABLES[:4]}
    assert a_left == {"spans": ["new"], "rewards": ["new"], "trajectories": ["new"], "transitions": ["new"]}
    for name in ("spans", "rewards", "trajectories", "transitions"):
        assert rows(lake, name).filter(pl.col("tenant") == "b").height == 1, name
    assert rows(lake, "quarantine")["kafka_offset"].to_list() == [6]
    after = counts(lake)
    assert {n: before[n] - after[n] for n in before} == {
        "spans": 3,
        "rewards": 2,
        "trajectories": 2,
        "transitions": 2,
        "training_lineage": 0,
        "quarantine": 1,
        "judgements": 0,  # none judged here: tests/pipelines/test_judge.py forgets a judged rollout
    }
    rec = rows(lake, "deletions").to_dicts()
    assert [(r["tenant"], r["rollout_id"], r["before"]) for r in rec] == [
        ("a", None, dt.datetime(2026, 1, 10, tzinfo=dt.UTC))
    ]
    assert rec[0]["rows_removed"] == 10
    for name in ("spans", "trajectories"):
        disk = on_disk(lake, name)
        assert sorted(disk.filter(pl.col("tenant") == "a")["rollout_id"]) == ["new"], name


def test_forget_a_whole_tenant_keeps_shared_lineage(tmp_path: Path) -> None:
    lake = two_tenant_lake(tmp_path / "lake")
    done = forget(lake, "a", requested_by="test")
    for name in ("spans", "rewards", "trajectories", "transitions"):
        assert set(rows(lake, name)["tenant"]) == {"b"}, name
        assert on_disk(lake, name).filter(pl.col("tenant") == "a").height == 0, name
    # r2 was only a's: its lineage goes; r1 is also b's: kept
    assert sorted(rows(lake, "training_lineage")["rollout_id"]) == ["r1", "r1"]
    assert rows(lake, "quarantine")["kafka_offset"].to_list() == [7]
    assert done.tables["spans"].files_removed > 0
    assert rows(lake, "deletions")["rows_removed"].to_list() == [done.rows]


def test_unknown_tenant_deletes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = two_tenant_lake(root)
    before = counts(lake)
    versions = {n: lake.version(n) for n in FORGET_TABLES}
    res = cli(root, "--tenant", "nobody", "--yes")
    assert res.exit_code == 1
    assert "tenant 'nobody'" in said(res) and "nothing was deleted" in said(res)
    assert counts(lake) == before and {n: lake.version(n) for n in FORGET_TABLES} == versions
    assert lake.table("deletions") is None
    with pytest.raises(UnknownTenantError):
        forget(lake, "nobody")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--before", "2026-13-45"], "not a date"),
        (["--before", "last tuesday"], "not a date"),
        (["--rollout", "r1", "--before", "2026-01-01"], "not both"),
    ],
)
def test_bad_options_exit_2_and_delete_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    root = tmp_path / "lake"
    lake = two_tenant_lake(root)
    before = counts(lake)
    res = cli(root, "--tenant", "a", "--yes", *args)
    assert res.exit_code == 2, res.output
    assert message in said(res)
    assert counts(lake) == before and lake.table("deletions") is None


def test_a_known_tenant_with_nothing_to_forget_is_recorded(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = two_tenant_lake(root)
    before = counts(lake)
    res = cli(root, "--tenant", "a", "--rollout", "no-such-rollout", "--yes")
    assert res.exit_code == 0, res.output
    assert "nothing to delete" in said(res) and counts(lake) == before
    assert rows(lake, "deletions")["rows_removed"].to_list() == [0]


def test_plan_matches_what_delta_deletes(tmp_path: Path) -> None:
    """The plan's counts (Polars) and Delta's delete (SQL) are the same filter in two languages."""
    lake = two_tenant_lake(tmp_path / "lake")
    for sel in [
        Selector("forget", tenant="a", rollout="r1"),
        Selector("forget", tenant="b", before=T0 + DAY),
        Selector("retention", before=T0 + DAY / 2, tables=("spans", "rewards", "transitions", "quarantine")),
    ]:
        planned = plan(sel, frames_of(lake))
        lake2 = two_tenant_lake(tmp_path / f"copy-{sel.kind}-{sel.tenant}")
        done = execute(lake2, sel, vacuum=False, record=False)
        assert {t.table: t.rows for t in planned.tables} == {n: r.rows for n, r in done.tables.items()}
        assert planned.rows > 0


def test_a_trace_the_trajectories_do_not_list_goes_with_its_responses(tmp_path: Path) -> None:
    """A span names the rollout in a trace no trajectory lists yet (the step has not run on it): the trace's
    other spans, the response one of them holds, the gateway's record of that response and the reward naming
    it all go. (The spans naming the rollout and the traces the trajectories list are read together; this
    trace's other spans need a read of their own.)"""
    lake = two_tenant_lake(tmp_path / "lake")
    put(
        lake,
        "spans",
        [
            span("a", "r1", "ta9", "s9", T0, 9),
            # the call's span names no rollout: its trace stands for it, as the gateway's does
            span("a", "ta9", "ta9", "s10", T0, 10, llm_response_id="resp-a9"),
            span("a", "ta9g", "ta9g", "s11", T0, 11, llm_response_id="resp-a9", service_name="agentlake-gateway"),
            span("a", "r2", "ta2", "s12", T0 + DAY, 12),
        ],
    )
    put(lake, "rewards", [reward("a", "e9", T0, llm_response_id="resp-a9")])
    sel = Selector("forget", tenant="a", rollout="r1")
    planned = plan(sel, frames_of(lake))
    execute(lake, sel)
    left = rows(lake, "spans").filter(pl.col("tenant") == "a")
    assert sorted(left["trace_id"].to_list()) == ["ta2", "ta2"]
    assert "e9" not in rows(lake, "rewards")["reward_id"].to_list()
    assert {t.table: t.rows for t in planned.tables}["spans"] == 6  # s1, s4, ta1g's s5, s9, s10, s11


# --- a run that commits between the plan and the delete ---------------------------------------------
def _counting_plans(monkeypatch: pytest.MonkeyPatch) -> list[Selector]:
    import pipelines.lake.forget as forget_module

    made: list[Selector] = []
    real = forget_module.plan

    def counted(sel: Selector, frames: Any) -> Any:
        made.append(sel)
        return real(sel, frames)

    monkeypatch.setattr(forget_module, "plan", counted)
    return made


def test_a_quiet_lake_is_planned_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing but the deletes landed since the plan: a second plan could find nothing, and is not made."""
    lake = two_tenant_lake(tmp_path / "lake")
    made = _counting_plans(monkeypatch)
    done = execute(lake, Selector("forget", tenant="a", rollout="r1"))
    assert len(made) == 1 and done.rows > 0
    assert plan(Selector("forget", tenant="a", rollout="r1"), frames_of(lake)).rows == 0


@pytest.mark.parametrize("table", ["spans", "trajectories", "transitions"])
def test_rows_a_run_puts_back_after_the_delete_are_deleted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    """A pipeline run that read the lake before the delete and appends after it puts the rollout's rows back;
    forget sees a commit that is not its own and plans again. The other run's append is real (a Delta commit);
    only its moment is forced, from inside forget's delete of ``table``: the one instant a test cannot time."""
    lake = two_tenant_lake(tmp_path / "lake")
    sel = Selector("forget", tenant="a", rollout="r1")
    back = rows(lake, table).filter((pl.col("tenant") == "a") & (pl.col("rollout_id") == "r1"))
    assert back.height > 0
    planned = {t.table: t.rows for t in plan(sel, frames_of(lake)).tables}
    real_delete = DeltaTable.delete
    put_back: list[int] = []

    def delete_then_another_run_appends(self: DeltaTable, *args: Any, **kwargs: Any) -> Any:
        metrics = real_delete(self, *args, **kwargs)
        if not put_back and self.table_uri.rstrip("/").endswith(f"/{table}"):
            put_back.append(lake.write(table, back.to_arrow()))
        return metrics

    monkeypatch.setattr(DeltaTable, "delete", delete_then_another_run_appends)
    made = _counting_plans(monkeypatch)
    done = execute(lake, sel)
    assert put_back and len(made) == 2
    assert plan(sel, frames_of(lake)).rows == 0, "a row put back after the delete survived the forget"
    assert done.tables[table].rows == planned[table] + back.height  # deleted, put back, deleted again


# --- replay from Kafka honours recorded deletions -------------------------------------------------
def _pipeline(settings: Settings, lake: Lake) -> None:
    """One incremental run of every step, as the Dagster assets do."""
    from pipelines.bronze.ingest import ingest
    from pipelines.bronze.span_rewards import extract_span_rewards
    from pipelines.gold.transitions_step import update_transitions
    from pipelines.silver.trajectories_step import update_trajectories

    k = settings.kafka
    ingest(lake, k, "spans", workers=0)
    ingest(lake, k, "rewards", workers=0)
    extract_span_rewards(lake, k.spans_topic)
    update_trajectories(lake, k, idle_timeout_s=settings.credit.idle_timeout_s)
    update_transitions(lake, settings.credit)


@pytest.mark.kafka
def test_incremental_runs_and_replay_do_not_bring_forgotten_rows_back(settings: Settings, tmp_path: Path) -> None:
    from pipelines.lake.replay import replay
    from tests.pipelines.otel import Call, Rollout, make_spans, produce, reward_record, span_record

    k = settings.kafka

    def rollout(rid: str, i: int) -> Rollout:
        calls = [Call(prompt=[1, 2, 3], response=[10 + i, 11], logprobs=[-0.1, -0.2])]
        return Rollout(rid, task_id=f"task-{rid}", calls=calls, final_reward=1.0)

    records = [
        span_record(make_spans(rollout(r, i)), key=r, tenant=t)
        for i, (t, r) in enumerate([("default", "r1"), ("default", "r2"), ("team-b", "r3")])
    ]
    records.append({"key": b"r1", "value": b"\x00junk", "headers": [(topics.HEADER_TENANT, b"default")]})
    produce(k, k.spans_topic, records)
    produce(k, k.rewards_topic, [reward_record({"rollout_id": "r1", "value": 0.5, "event_id": "late-r1"})])
    lake = Lake(settings.lake.root)
    _pipeline(settings, lake)
    assert sorted(rows(lake, "trajectories")["rollout_id"]) == ["r1", "r2", "r3"]
    assert rows(lake, "quarantine").height == 1

    done = forget(lake, "default", rollout="r1")
    assert set(done.tables) >= {"spans", "rewards", "trajectories", "transitions", "quarantine"}
    kept = {n: rows(lake, n).height for n in ("spans", "rewards", "trajectories", "transitions")}

    # the next incremental run (nothing new, then a new rollout) does not bring r1 back
    _pipeline(settings, lake)
    produce(k, k.spans_topic, [span_record(make_spans(rollout("r4", 4)), key="r4")])
    _pipeline(settings, lake)
    assert sorted(rows(lake, "trajectories")["rollout_id"]) == ["r2", "r3", "r4"]
    assert "r1" not in rows(lake, "spans")["rollout_id"].to_list()
    assert rows(lake, "trajectories").height == kept["trajectories"] + 1

    # a rebuild from Kafka applies the recorded deletion: same rows as the incremental lake
    fresh = Lake(str(tmp_path / "replayed"))
    out = replay(settings, fresh, deletions_from=lake)
    assert out["forgotten_bronze"] > 0
    for name, key, drop in [
        ("spans", ["trace_id", "span_id"], ["received_at"]),
        ("rewards", ["reward_id"], []),
        ("trajectories", ["rollout_id"], ["updated_at"]),
        ("transitions", ["transition_id"], ["created_at"]),
        ("quarantine", ["kafka_offset"], ["quarantined_at"]),
    ]:
        a = rows(lake, name).drop(drop).sort(key)
        b = rows(fresh, name).drop(drop).sort(key)
        assert a.equals(b), name
    assert rows(fresh, "deletions")["deletion_id"].to_list() == [done.deletion_id]
    assert on_disk(fresh, "spans").filter(pl.col("rollout_id") == "r1").height == 0

    # without the record the same rebuild brings r1 back: the deletions table is what keeps it out
    unaware = Lake(str(tmp_path / "unaware"))
    replay(settings, unaware, deletions_from=Lake(str(tmp_path / "no-deletions")))
    assert "r1" in rows(unaware, "trajectories")["rollout_id"].to_list()


def test_declining_the_confirmation_deletes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = two_tenant_lake(root)
    before = counts(lake)
    env = {"AGENTLAKE_LAKE": str(root), "AGENTLAKE_STATE_DIR": str(tmp_path / "state")}
    res = CliRunner().invoke(app, ["forget", "--tenant", "a", "--rollout", "r1"], input="n\n", env=env)
    assert res.exit_code == 1 and "Aborted" in res.output
    assert counts(lake) == before and lake.table("deletions") is None


def test_forget_on_the_object_store(object_store: ObjectStore, tmp_path: Path) -> None:
    """The default lake is an S3 bucket: the delete, the vacuum and the record work there alike."""
    lake = two_tenant_lake(Lake(object_store.lake_root(), object_store.storage_options))
    assert on_disk(lake, "spans").filter(pl.col("trace_id") == "ta1").height == 4
    env = {
        "AGENTLAKE_LAKE": lake.root,
        "AGENTLAKE_LAKE__STORAGE_OPTIONS": json.dumps(dict(lake.storage_options)),
        "AGENTLAKE_STATE_DIR": str(tmp_path / "state"),
    }
    res = CliRunner().invoke(app, ["forget", "--tenant", "a", "--rollout", "r1", "--yes"], env=env)
    assert res.exit_code == 0, res.output
    assert sorted(rows(lake, "spans")["span_id"]) == ["s2", "s3", "s6"]
    for name in ("spans", "rewards", "trajectories", "transitions"):
        disk = on_disk(lake, name)
        assert disk.filter((pl.col("tenant") == "a") & (pl.col("rollout_id") == "r1")).height == 0, name
    assert on_disk(lake, "spans").filter(pl.col("trace_id").is_in(["ta1", "ta1g"])).height == 0
    assert rows(lake, "deletions")["rows_removed"].to_list() == [10]


def test_no_forgotten_text_stays_in_the_delta_log(tmp_path: Path) -> None:
    """Delta keeps each file's min/max per column in its log, which a delete + vacuum leaves behind:
    the tables are created without statistics on their content columns, so no message is there."""
    root = tmp_path / "lake"
    two_tenant_lake(root)
    assert cli(root, "--tenant", "a", "--rollout", "r1", "--yes").exit_code == 0
    logs = [f for f in root.rglob("*") if f.is_file() and "_delta_log" in f.parts]
    assert logs
    assert not [f for f in logs if b"secret of a/r1" in f.read_bytes()]
    spans = DeltaTable(str(root / "spans"))
    assert "input_messages" not in spans.metadata().configuration["delta.dataSkippingStatsColumns"].split(",")
    assert "rollout_id" in spans.metadata().configuration["delta.dataSkippingStatsColumns"].split(",")


# --- generated lakes against a reference ------------------------------------------------------------
FORGET_EXAMPLES = int(os.environ.get("LAKE_TEST_EXAMPLES", "25"))

_span_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # tenant
        st.sampled_from(["t0", "t1", "t2", "t3", "t4"]),  # trace
        st.sampled_from(["r0", "r1", "r2", None]),  # rollout the span names (None: its trace stands for it)
        st.sampled_from(["p0", "p1", "p2", None]),  # the LLM response it holds
        st.integers(0, 3),  # day
    ),
    min_size=1,
    max_size=30,
)
_listed = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from(["r0", "r1", "r2"]),
        st.sets(st.sampled_from(["t0", "t1", "t2", "t3", "t4"]), max_size=2),
    ),
    max_size=4,
)


def reference_forget(spans: list[dict], trajectories: list[dict], tenant: str, rollout: str) -> set[str]:
    """The span ids forgetting ``tenant``'s ``rollout`` removes, worked out row by row: the traces the
    trajectories list for it and those its spans name, every response in them, the traces holding those
    responses (the gateway's records); every span of the tenant naming the rollout or in one of those traces."""
    mine = [s for s in spans if s["tenant"] == tenant]
    traces = {t for r in trajectories if r["tenant"] == tenant and r["rollout_id"] == rollout for t in r["trace_ids"]}
    traces |= {s["trace_id"] for s in mine if s["rollout_id"] == rollout}
    responses = {s["llm_response_id"] for s in mine if s["trace_id"] in traces and s["llm_response_id"]}
    traces |= {s["trace_id"] for s in mine if s["llm_response_id"] in responses}
    return {s["span_id"] for s in mine if s["rollout_id"] == rollout or s["trace_id"] in traces}


@settings(max_examples=FORGET_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated=_span_rows, listed=_listed, rollout=st.sampled_from(["r0", "r1", "r2"]), commits=st.integers(1, 3))
def test_forget_one_rollout_removes_what_the_reference_removes(
    generated: list[tuple[str, str, str | None, str | None, int]],
    listed: list[tuple[str, str, set[str]]],
    rollout: str,
    commits: int,
) -> None:
    """Generated lakes: traces spread over days and tenants, spans naming the rollout or not, responses
    shared between traces (a gateway's record in a trace of its own, whose other spans lie on other days).
    Forgetting one rollout of tenant a removes exactly the spans the reference names, the plan's count is
    Delta's, and every other span stays (the delete's day bound misses none of the rollout's days)."""
    spans = [
        span(tenant, rid or trace, trace, f"s{i}", T0 + day * DAY, i, llm_response_id=resp)
        for i, (tenant, trace, rid, resp, day) in enumerate(generated)
    ]
    trajectories = [trajectory(t, r, sorted(ts), T0) for t, r, ts in listed]
    with tempfile.TemporaryDirectory() as root:
        lake = Lake(root)
        for part in range(commits):  # several commits: several files per day
            if chunk := spans[part::commits]:
                put(lake, "spans", chunk)
        if trajectories:
            put(lake, "trajectories", trajectories)
        gone = reference_forget(spans, trajectories, "a", rollout)
        sel = Selector("forget", tenant="a", rollout=rollout)
        planned = {t.table: t.rows for t in plan(sel, frames_of(lake)).tables}
        if not any(s["tenant"] == "a" for s in spans) and not any(t == "a" for t, _, _ in listed):
            with pytest.raises(UnknownTenantError):
                forget(lake, "a", rollout=rollout)
            return
        done = forget(lake, "a", rollout=rollout)
        left = set(rows(lake, "spans")["span_id"].to_list())
        assert left == {s["span_id"] for s in spans} - gone
        assert planned.get("spans", 0) == len(gone)
        assert (done.tables["spans"].rows if "spans" in done.tables else 0) == len(gone)
