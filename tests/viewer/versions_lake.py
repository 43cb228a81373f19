"""A lake for the versions and health pages, built by the real pipeline: two tenants' rollouts (OTel SDK spans,
decoded as ingestion decodes them, assembled by the silver and gold steps), a registry line of three versions
(trainer.registry), what the first two trained on (trainer.lineage), their evaluations (serving.evaluation_table)
and one undecodable Kafka record in `quarantine`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.gold.transitions_step import update_transitions
from pipelines.silver.trajectories_step import update_trajectories
from schemas import topics
from schemas.config import CreditSettings, KafkaSettings
from schemas.lake import Lake
from schemas.tables import QUARANTINE
from serving.evaluation import Interval, Paired
from serving.evaluation_table import paired_rows, record
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from trainer.lineage import Lineage
from trainer.registry import Registry

KAFKA = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
A, B = "team-a", "team-b"
TRACKING = "http://127.0.0.1:5000/#/experiments/1/runs/abc123"


@dataclass(frozen=True)
class Spec:
    """One scripted rollout: who sent it, which agent and version sampled it, its reward, which day."""

    rollout_id: str
    tenant: str
    agent: str
    version: str
    reward: float | None
    day: int
    calls: int = 1


# v0001 sampled days 0-1, v0002 days 2-3; team-b's rewards are all 0.0 (a tenant sees only its own).
SPECS = [
    Spec("a-r0", A, "solver", "v0001", 0.0, 0),
    Spec("a-r1", A, "solver", "v0001", 1.0, 0),
    Spec("a-r2", A, "critic", "v0001", 0.5, 1),
    Spec("a-r3", A, "solver", "v0002", 1.0, 2, calls=2),
    Spec("a-r4", A, "solver", "v0002", 1.0, 3),
    Spec("a-r5", A, "critic", "v0002", None, 3),  # no reward: waits (no horizon) -> "waiting for a reward"
    Spec("b-r0", B, "spy", "v0001", 0.0, 0),
    Spec("b-r1", B, "spy", "v0001", 0.0, 1),
    Spec("b-r2", B, "spy", "v0002", 0.0, 2),
]


def _record(i: int, s: Spec) -> KafkaRecord:
    calls = [
        # the gateway's spelling: served name @ the registry's version
        Call(
            prompt=[1, i, k],
            response=[2, k + 3],
            logprobs=[-0.5, -0.25],
            policy_version=f"agentlake-policy@{s.version}",
        )
        for k in range(s.calls)
    ]
    at = DAY0 + dt.timedelta(days=s.day, minutes=i)
    r = Rollout(
        s.rollout_id,
        task_id=f"task-{i % 3}",
        calls=calls,
        final_reward=s.reward,
        agent=s.agent,
        t0_ns=int(at.timestamp()) * 10**9,
    )
    headers = [(topics.HEADER_TENANT, s.tenant.encode())]
    return KafkaRecord("s", 0, i, s.rollout_id.encode(), encode(make_spans(r)), headers)


def build(root: Path) -> Lake:
    """The lake described in the module doc, at ``root``."""
    lake = Lake(str(root))
    recs = [_record(i, s) for i, s in enumerate(SPECS)]
    spans, _ = decode_spans(recs)
    lake.write("spans", spans, txns={"kafka:s:0": recs[-1].offset})
    # one record no decoder can read: quarantined at the next offset, as ingestion does
    bad = KafkaRecord("s", 0, len(recs), b"junk", b"not a protobuf", [(topics.HEADER_TENANT, A.encode())])
    table, quarantined = decode_spans([bad])
    assert table.num_rows == 0 and quarantined
    lake.write("quarantine", pa.Table.from_pylist(quarantined, schema=QUARANTINE), txns={"kafka:s:0": bad.offset})
    update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW)
    update_transitions(lake, CreditSettings(), now=NOW)

    reg = Registry(lake)
    for n, parent in ((1, None), (2, "v0001"), (3, "v0002")):
        reg.add(
            version=f"v{n:04d}",
            version_number=n,
            base_model="smollm2-135m",
            kind="lora",
            path=f"/ckpt/v{n:04d}",
            parent_version=parent,
            served_name="policy",
            train_table=lake.uri("transitions"),
            n_transitions=4,
            tracking_url=TRACKING if n == 2 else None,
        )
    reg.set_status("v0001", "published", published_at=DAY0)
    reg.set_status("v0002", "published", published_at=DAY0 + dt.timedelta(days=2))
    transitions = pl.read_delta(lake.uri("transitions"))
    lineage = Lineage(lake)
    for version, ids in (("v0001", ["a-r0", "a-r1", "b-r0"]), ("v0002", ["a-r2", "a-r3", "b-r1"])):
        rows = transitions.filter(pl.col("rollout_id").is_in(ids)).select("transition_id", "rollout_id")
        lineage.record(
            model_version=version, train_table=lake.uri("transitions"), table_version=0, rows=rows.to_arrow()
        )
    paired = Paired(
        n_tasks=40,
        confidence=0.95,
        before=Interval(0.40, 0.31, 0.49),
        after=Interval(0.62, 0.55, 0.70),
        diff=Interval(0.22, 0.12, 0.31),
        verdict="gain beyond noise",
    )
    record(
        lake,
        paired_rows(paired, before_version="v0001", after_version="v0002", compare_before=True),
        task_set="held-out-40",
        n_tasks=40,
        n_samples=4,
        confidence=0.95,
        source="demo",
        at=DAY0,
    )
    return lake
