"""What the health page shows, from the lake alone: where ingestion is in each Kafka partition (the watermarks
ingestion commits with its rows), what was left out (quarantined, dropped, expired), and reward per agent.

Ingest lag proper is the broker's end offset minus the lake's watermark; the viewer never talks to Kafka, so
it shows the lake's side (each partition's watermark and when the table last took rows) and says so. The
watermarks are Delta app transactions (``pipelines.bronze.positions``), read from each table's log: the
partitions are those the table's file statistics name, so nothing is scanned.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipelines.bronze.positions import app_id, base_id, epoch_id
from schemas.config import CreditSettings, KafkaSettings
from viewer.auth import Scope
from viewer.lake import ViewerLake

BRONZE = ("spans", "rewards")  # the tables ingestion writes from Kafka, each with its topic


@dataclass(frozen=True)
class PartitionPosition:
    """The lake's side of one partition: the last lake offset it holds and the current log's base."""

    table: str
    topic: str
    partition: int
    watermark: int | None  # None: nothing ingested from it yet
    base: int
    epoch: int  # log resets of the topic the table accepted


@dataclass(frozen=True)
class TablePosition:
    """A bronze table: its Delta version, when it last committed, and its partitions' watermarks."""

    table: str
    version: int | None  # None: never written
    last_commit: dt.datetime | None
    partitions: list[PartitionPosition]


def ingest_positions(lake: ViewerLake, kafka: KafkaSettings) -> list[TablePosition]:
    """Each bronze table's watermarks, per (topic, partition) its rows or the settings name."""
    topics = {"spans": kafka.spans_topic, "rewards": kafka.rewards_topic}
    out = []
    for table in BRONZE:
        dt_ = lake.lake.table(table)
        if dt_ is None:
            out.append(TablePosition(table, None, None, []))
            continue
        seen = _topic_partitions(dt_)
        names = sorted({topics[table], *seen})
        parts = []
        for topic in names:
            top = max(seen.get(topic, {0}))
            epoch = dt_.transaction_version(epoch_id(topic)) or 0
            for p in range(top + 1):
                mark = dt_.transaction_version(app_id(topic, p))
                if mark is None and topic not in seen:
                    continue  # a configured topic this table never took rows from
                base = dt_.transaction_version(base_id(topic, p)) or 0
                parts.append(PartitionPosition(table, topic, p, mark, base, epoch))
        history = dt_.history(1)
        ts = history[0].get("timestamp") if history else None
        last = dt.datetime.fromtimestamp(ts / 1000, dt.UTC) if isinstance(ts, int) else None
        out.append(TablePosition(table, dt_.version(), last, parts))
    return out


def _topic_partitions(dt_: Any) -> dict[str, set[int]]:
    """The topics and partitions a table's files hold, from the per-file statistics in its log."""
    actions = pa.table(dt_.get_add_actions(flatten=True)).to_pylist()
    out: dict[str, set[int]] = {}
    for a in actions:
        for end in ("min", "max"):
            topic, part = a.get(f"{end}.kafka_topic"), a.get(f"{end}.kafka_partition")
            if topic is not None and part is not None:
                out.setdefault(str(topic), set()).add(int(part))
    return out


@dataclass(frozen=True)
class Count:
    """One count of rows left out or waiting, with what it means."""

    label: str
    n: int
    meaning: str


def left_out(lake: ViewerLake, scope: Scope, credit: CreditSettings, now: dt.datetime) -> list[Count]:
    """What did not become training data, or not yet: the scope's rollouts and transitions by what happened to
    them; and, for the operator, the quarantined Kafka records (they have no tenant until decoded)."""
    cond, params = ("TRUE", {}) if scope.operator else ("tenant = $tenant", {"tenant": scope.tenant})
    horizon = credit.reward_horizon_s
    cutoff = now - dt.timedelta(seconds=horizon) if horizon else None
    traj = lake.frame(
        f"""
        SELECT
          count(*) FILTER (WHERE status = 'running') AS running,
          count(*) FILTER (WHERE status IN ('failed', 'timed_out')) AS failed,
          count(*) FILTER (WHERE status IN ('finished', 'failed', 'timed_out') AND final_reward IS NULL
                           AND coalesce(n_llm_calls, 0) > 0
                           AND ($cutoff IS NULL OR end_time >= $cutoff)) AS waiting,
          count(*) FILTER (WHERE status IN ('finished', 'failed', 'timed_out') AND final_reward IS NULL
                           AND coalesce(n_llm_calls, 0) > 0
                           AND $cutoff IS NOT NULL AND end_time < $cutoff) AS expired
        FROM trajectories WHERE {cond}
        """,
        {**params, "cutoff": cutoff},
    ).row(0, named=True)
    trans = lake.frame(
        f"""
        SELECT count(DISTINCT (tenant, rollout_id)) FILTER (WHERE reward_source = 'default') AS defaulted,
               count(*) FILTER (WHERE token_status = 'mismatch') AS mismatch
        FROM transitions WHERE {cond}
        """,
        params,
    ).row(0, named=True)
    drop = credit.missing_reward == "drop"
    horizon_text = f"{horizon:g} s" if horizon else "no horizon set (credit.reward_horizon_s): they wait forever"
    counts = [
        Count("running", int(traj["running"]), "rollouts not finished yet"),
        Count("failed or timed out", int(traj["failed"]), "rollouts that ended in an error or timed out"),
        Count(
            "waiting for a reward",
            int(traj["waiting"]),
            f"ended rollouts with LLM calls and no final reward, within the reward horizon ({horizon_text})",
        ),
        Count(
            "expired, dropped" if drop else "expired",
            int(traj["expired"]),
            "ended rollouts whose reward horizon passed without a reward: "
            + (
                "dropped (credit.missing_reward = drop)"
                if drop
                else f"trained with the default reward {credit.missing_reward}"
            ),
        ),
        Count(
            "trained on the default reward",
            int(trans["defaulted"]),
            "rollouts whose transitions have reward_source 'default'",
        ),
        Count(
            "token mismatch",
            int(trans["mismatch"]),
            "transitions whose retokenized ids differ from what the server renders: "
            + (
                "trained anyway (credit.train_token_mismatch)"
                if credit.train_token_mismatch
                else "left out of training"
            ),
        ),
    ]
    if scope.operator:
        q = lake.frame("SELECT count(*) AS n FROM quarantine").item()
        counts.append(
            Count("quarantined", int(q), "Kafka records ingestion could not decode, kept in the quarantine table")
        )
    return counts


def recent_quarantine(lake: ViewerLake, scope: Scope, *, limit: int = 10) -> list[dict[str, Any]]:
    """The newest quarantined records' positions and errors; the operator's only (they carry no tenant)."""
    if not scope.operator:
        return []
    frame = lake.frame(
        "SELECT kafka_topic, kafka_partition, kafka_offset, error, quarantined_at FROM quarantine "
        "ORDER BY quarantined_at DESC LIMIT $limit",
        {"limit": limit},
    )
    return list(frame.iter_rows(named=True))
