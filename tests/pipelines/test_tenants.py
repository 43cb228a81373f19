"""Tenants cannot touch each other (issue 11): nothing tenant B sends changes a row of tenant A.

Each test delivers tenant A's rollout, runs the pipeline, keeps A's `trajectories` and
`transitions` rows, then lets tenant B send something that reuses one of A's ids (a rollout id,
trace id, response id, event id, attempt id or task id) and runs again: A's rows must be exactly
what they were, and B's data must land in rows of B's own. Records go through a real broker with
the tenant header the collector stamps from the bearer token (and the body's ``tenant`` it adds to
reward events), are ingested by `pipelines.bronze.ingest` into real Delta tables and assembled by the
real steps, as the Dagster assets do.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from pipelines.bronze.ingest import ingest
from pipelines.gold.baselines import RunningBaseline
from pipelines.gold.transitions_step import removed_rollouts, update_transitions
from pipelines.silver.trajectories_step import REMOVED_KEY, update_trajectories
from schemas.config import CreditSettings, Settings, load_settings
from schemas.lake import Lake
from schemas.tables import TRAJECTORIES
from tests.pipelines.otel import MS, Call, Rollout, make_spans, produce, reward_record, span_record
from trainer.config import config_from_settings
from trainer.data import read_transitions
from trainer.round import read_pending

pytestmark = pytest.mark.kafka

A, B = "team-a", "team-b"
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
T0 = 1_750_000_000_000 * MS // 1000
SD2 = 2**0.5 / 2  # sample std of {1, 0}


class Tenants:
    """Two tenants writing into one lake through the broker; the pipeline's steps run on demand."""

    def __init__(self, settings: Settings, credit: CreditSettings | None = None) -> None:
        self.kafka = settings.kafka
        self.lake = Lake(settings.lake.root)
        self.credit = credit or CreditSettings()

    def spans(self, tenant: str, rollout: Rollout) -> list[ReadableSpan]:
        spans = make_spans(rollout)
        produce(self.kafka, self.kafka.spans_topic, [span_record(spans, tenant=tenant)])
        return spans

    def reward(self, tenant: str, **event: Any) -> None:
        """A reward event as the collector writes it: the token's tenant in the header and the body."""
        record = reward_record({**event, "tenant": tenant}, tenant=tenant)
        produce(self.kafka, self.kafka.rewards_topic, [record])

    def run(self) -> None:
        ingest(self.lake, self.kafka, "spans", workers=0)
        ingest(self.lake, self.kafka, "rewards", workers=0)
        update_trajectories(self.lake, self.kafka, idle_timeout_s=1e9, now=NOW)
        update_transitions(self.lake, self.credit, now=NOW)

    def rows(self, table: str, tenant: str) -> pl.DataFrame:
        frame = pl.read_delta(self.lake.uri(table)).filter(pl.col("tenant") == tenant)
        frame = frame.drop("updated_at", "created_at", strict=False)
        return frame.sort([c for c in ("rollout_id", "attempt_id", "step") if c in frame.columns], nulls_last=True)

    def snapshot(self, tenant: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        return self.rows("trajectories", tenant), self.rows("transitions", tenant)


def one_call(i: int, response_id: str | None = None) -> Call:
    return Call(prompt=[1, 2, i], response=[3, i], logprobs=[-0.5, -0.25], response_id=response_id)


def rollout(rid: str, reward: float | None, *, calls: int = 1, t0: int = T0, **kw: Any) -> Rollout:
    return Rollout(rid, calls=[one_call(i) for i in range(calls)], final_reward=reward, t0_ns=t0, **kw)


def trace_of(spans: list[ReadableSpan]) -> str:
    return format(spans[0].context.trace_id, "032x")


@pytest.fixture()
def tenants(settings: Settings) -> Tenants:
    return Tenants(settings)


def a_scored(tenants: Tenants) -> tuple[list[ReadableSpan], tuple[pl.DataFrame, pl.DataFrame]]:
    """Tenant A's rollout ``r`` (one call, task ``t``, reward 1.0), through the pipeline; A's rows."""
    spans = tenants.spans(A, rollout("r", 1.0, task_id="t"))
    tenants.run()
    before = tenants.snapshot(A)
    assert before[0]["final_reward"].to_list() == [1.0] and before[1]["reward"].to_list() == [1.0]
    return spans, before


def assert_unchanged(tenants: Tenants, before: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    after = tenants.snapshot(A)
    assert after[0].equals(before[0]), f"A's trajectories changed:\n{before[0]}\n->\n{after[0]}"
    assert after[1].equals(before[1]), f"A's transitions changed:\n{before[1]}\n->\n{after[1]}"


def test_a_reward_naming_another_tenants_rollout_id_scores_nothing_of_it(tenants: Tenants) -> None:
    _, before = a_scored(tenants)
    tenants.reward(B, rollout_id="r", value=-1.0, event_id="b-1")
    tenants.run()
    assert_unchanged(tenants, before)
    assert tenants.rows("trajectories", B).is_empty()  # B has no rollout `r`: the event finds nothing


def test_a_reward_naming_another_tenants_trace_id_scores_nothing_of_it(tenants: Tenants) -> None:
    spans, before = a_scored(tenants)
    tenants.reward(B, trace_id=trace_of(spans), value=-1.0, event_id="b-1")
    tenants.run()
    assert_unchanged(tenants, before)
    assert tenants.rows("trajectories", B).is_empty()


def test_a_reward_naming_another_tenants_response_id_scores_nothing_of_it(tenants: Tenants) -> None:
    _, before = a_scored(tenants)
    response_id = before[0]["calls"][0][0]["llm_response_id"]
    assert response_id == "resp-r-None-0"
    tenants.reward(B, response_id=response_id, value=-1.0, event_id="b-1")
    tenants.run()
    assert_unchanged(tenants, before)
    assert tenants.rows("trajectories", B).is_empty()


def test_an_event_id_reused_by_another_tenant_replaces_no_reward_of_the_first(tenants: Tenants) -> None:
    tenants.spans(A, rollout("r", None, task_id="t"))
    tenants.reward(A, rollout_id="r", value=1.0, event_id="e-1")
    tenants.run()
    before = tenants.snapshot(A)
    assert before[0]["final_reward"].to_list() == [1.0]
    # B runs a rollout of the same id and scores it with the same event id, later
    tenants.spans(B, rollout("r", None, task_id="t", t0=T0 + 60_000 * MS))
    tenants.reward(B, rollout_id="r", value=-1.0, event_id="e-1")
    tenants.run()
    assert_unchanged(tenants, before)
    mine = tenants.rows("trajectories", B)
    assert mine["final_reward"].to_list() == [-1.0]
    assert [e["reward_id"] for e in mine["rewards"][0]] == ["e-1"]


def test_spans_naming_another_tenants_rollout_id_make_a_rollout_of_their_own(tenants: Tenants) -> None:
    _, before = a_scored(tenants)
    tenants.spans(B, rollout("r", 0.0, calls=2, task_id="t"))
    tenants.run()
    assert_unchanged(tenants, before)
    assert before[0]["n_llm_calls"].to_list() == [1]
    mine = tenants.rows("trajectories", B)
    assert mine["n_llm_calls"].to_list() == [2] and mine["final_reward"].to_list() == [0.0]
    assert tenants.rows("transitions", B)["reward"].to_list() == [0.0, 0.0]


def test_an_attempt_id_shared_with_another_tenant_keeps_each_tenants_attempt(tenants: Tenants) -> None:
    tenants.spans(A, rollout("r", 1.0, task_id="t", attempt_id="a1", t0=T0 + 60_000 * MS))
    tenants.run()
    before = tenants.snapshot(A)
    # B's attempt of the same ids started earlier: it must not take over A's row (nor its label)
    tenants.spans(B, rollout("r", -1.0, calls=2, task_id="t", attempt_id="a1"))
    tenants.run()
    assert_unchanged(tenants, before)
    mine = tenants.rows("trajectories", B)
    assert mine.select("attempt_id", "n_llm_calls", "final_reward").rows() == [("a1", 2, -1.0)]


def test_a_later_attempt_of_another_tenant_supersedes_no_attempt_of_the_first(tenants: Tenants) -> None:
    tenants.spans(A, rollout("r", 1.0, task_id="t", attempt_id="a1"))
    tenants.run()
    before = tenants.snapshot(A)
    assert before[1]["attempt_id"].to_list() == ["a1"]
    # B's rollout of the same id ends later under another attempt id: A's latest attempt is still a1
    tenants.spans(B, rollout("r", -1.0, task_id="t", attempt_id="a2", t0=T0 + 60_000 * MS))
    tenants.run()
    assert_unchanged(tenants, before)
    assert tenants.rows("transitions", B)["attempt_id"].to_list() == ["a2"]


def test_grpo_groups_a_task_within_its_tenant(tenants: Tenants) -> None:
    tenants.spans(A, rollout("a0", 1.0, task_id="t"))
    tenants.spans(A, rollout("a1", 0.0, task_id="t", t0=T0 + 1000 * MS))
    tenants.run()
    before = tenants.snapshot(A)
    assert before[1]["advantage"].to_list() == pytest.approx([0.5 / SD2, -0.5 / SD2], abs=1e-4)
    # B's rollouts of the same task score -1: A's group is A's alone
    tenants.spans(B, rollout("b0", -1.0, task_id="t", t0=T0 + 2000 * MS))
    tenants.spans(B, rollout("b1", -1.0, task_id="t", t0=T0 + 3000 * MS))
    tenants.run()
    assert_unchanged(tenants, before)
    theirs = tenants.rows("transitions", B)
    assert theirs["group_id"].to_list() == ["t", "t"] and theirs["advantage"].to_list() == [0.0, 0.0]


def test_the_running_baseline_is_kept_per_tenant(settings: Settings) -> None:
    tenants = Tenants(settings, CreditSettings(advantage="running_baseline"))
    tenants.spans(A, rollout("a0", 1.0))
    tenants.run()
    tenants.spans(B, rollout("b0", -1.0, t0=T0 + 1000 * MS))
    tenants.spans(B, rollout("a0", -1.0, t0=T0 + 2000 * MS))  # B reuses A's rollout id too
    tenants.run()
    tenants.spans(A, rollout("a1", 0.0, t0=T0 + 3000 * MS))
    tenants.run()
    mine = tenants.rows("transitions", A)
    # a1 is compared with A's baseline (a0's 1.0), never with B's -1.0s
    assert mine.select("rollout_id", "baseline", "advantage").rows() == [("a0", 0.0, 1.0), ("a1", 1.0, -1.0)]
    theirs = tenants.rows("transitions", B)
    assert theirs.select("rollout_id", "baseline").rows() == [("a0", -1.0), ("b0", 0.0)]
    from pipelines.gold.baselines import TenantBaselines  # (imported here: the module runs against older code too)
    from pipelines.gold.transitions_step import saved_baseline

    saved = TenantBaselines.from_json(saved_baseline(tenants.lake))
    assert (saved.of(A, "solver").count, saved.of(B, "solver").count) == (2, 2)


def test_a_policy_trains_on_the_tenants_its_settings_name(tenants: Tenants, tmp_path: Path) -> None:
    tenants.spans(A, rollout("r", 1.0, task_id="t"))
    tenants.spans(B, rollout("r", -1.0, task_id="t"))  # the same rollout, attempt and step ids
    tenants.run()
    root = tenants.lake.root
    everyone = read_transitions(Lake(root)).rows
    assert sorted(everyone["tenant"].to_pylist()) == [A, B]  # two ids: neither stands in for the other
    only_a = read_transitions(Lake(root), tenants=[A]).rows
    assert only_a["tenant"].to_pylist() == [A] and only_a["reward"].to_pylist() == [1.0]
    # what A already trained on never hides B's row
    pending = read_transitions(Lake(root), exclude_ids=only_a["transition_id"]).rows
    assert pending["tenant"].to_pylist() == [B]
    # the setting: `[trainer] tenants` reaches the round's reader
    where = {"lake": {"root": root}, "state": {"dir": str(tmp_path / "state")}}
    cfg = config_from_settings(load_settings(environ={}, overrides={**where, "trainer": {"tenants": [B]}}))
    assert cfg.tenants == [B] and config_from_settings(load_settings(environ={}, overrides=where)).tenants == []
    got = read_pending(cfg, -1, tenants.lake.version("transitions") or 0).rows
    assert got["tenant"].to_pylist() == [B] and got["reward"].to_pylist() == [-1.0]


def test_transition_ids_keep_the_default_tenant_and_never_collide_across_tenants() -> None:
    from pipelines import keys

    rows = pl.DataFrame(
        {
            "tenant": ["default", A, "default", "x/0", "x", "a@b", "a"],
            "rollout_id": ["r", "r", "r/a1/0@team-a", "r", "r", "r", "r"],
            "attempt_id": ["a1", "a1", None, "a1", "a1", "a1", "a1"],
            "step": [0, 0, 0, 0, 0, 0, 0],
        }
    )
    ids = rows.select(keys.transition_id()).to_series().to_list()
    assert ids[0] == "r/a1/0"  # the default tenant's ids are as before tenants were keys
    assert ids[1] == "r/a1/0@team-a"
    assert len(set(ids)) == len(ids), ids


def test_a_lake_from_before_tenants_were_keys_keeps_its_baseline_and_removals(tmp_path: Path) -> None:
    """Commit metadata written by the previous code: a running baseline without tenants is the
    default tenant's, and removed rollouts named without a tenant are taken as removed in every tenant."""
    from pipelines.gold.baselines import TenantBaselines  # (imported here: the module runs against older code too)

    legacy = RunningBaseline(0.5, 3).to_json()
    state = TenantBaselines.from_json(legacy)
    assert (state.of("default").value, state.of("default").count) == (0.5, 3)
    assert state.to_json() == legacy  # one tenant: saved exactly as before
    state.of(B).advance(1.0)
    assert TenantBaselines.from_json(state.to_json()).of(B).count == 1

    lake = Lake(str(tmp_path / "lake"))
    empty = TRAJECTORIES.empty_table()
    lake.write("trajectories", empty, metadata={REMOVED_KEY: json.dumps(["old-r"])})
    lake.write("trajectories", pa.Table.from_batches([], empty.schema), metadata={REMOVED_KEY: json.dumps([[A, "r"]])})
    table = lake.table("trajectories")
    assert table is not None
    assert removed_rollouts(table, None) == ({(A, "r")}, {"old-r"})


def test_the_uniqueness_check_counts_a_redelivery_within_a_tenant_only(tenants: Tenants) -> None:
    """The same trace and span ids from two tenants are two spans, not a client's retried export;
    the same spans sent twice by one tenant are (counted as ``redelivered``, never failed)."""
    from pipelines.defs.checks import spans_unique
    from pipelines.defs.resources import LakeResource

    spans = tenants.spans(A, rollout("r", 1.0, task_id="t"))
    produce(tenants.kafka, tenants.kafka.spans_topic, [span_record(spans, tenant=B)])
    ingest(tenants.lake, tenants.kafka, "spans", workers=0)
    check = spans_unique(LakeResource(root=tenants.lake.root))
    assert check.passed and check.metadata["redelivered"].value == 0, check.metadata
    produce(tenants.kafka, tenants.kafka.spans_topic, [span_record(spans, tenant=A)])
    ingest(tenants.lake, tenants.kafka, "spans", workers=0)
    check = spans_unique(LakeResource(root=tenants.lake.root))
    assert check.passed and check.metadata["redelivered"].value == len(spans), check.metadata
