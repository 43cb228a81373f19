"""Jobs, the Kafka sensor, the training sensor and schedule, the nightly maintenance and hourly compaction."""

import hashlib
import json
import time
from typing import Any

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    OpExecutionContext,
    RunRequest,
    ScheduleDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    job,
    op,
    sensor,
)

from pipelines.bronze.offset_hints import end_offsets_hint
from pipelines.bronze.positions import app_id, positions
from pipelines.defs.assets.policy import GPU_TAGS
from pipelines.defs.health import health_selection
from pipelines.defs.resources import CreditResource, KafkaResource, LakeResource, TrainerResource
from pipelines.gold.reward_horizon import horizon_due
from pipelines.lake.compaction import compact_recent
from pipelines.lake.retention import maintain
from schemas.config import Settings
from schemas.lake import Lake

ingest_job = define_asset_job("ingest", selection=AssetSelection.groups("bronze"))
# The collapse checks are left out: health_sensor runs them after every write (pipelines.defs.health).
lake_job = define_asset_job("lake", selection=AssetSelection.groups("bronze", "silver", "gold") - health_selection)
policy_job = define_asset_job("train", selection=AssetSelection.groups("policy") - health_selection, tags=GPU_TAGS)

# Evaluates the eager conditions on trajectories and transitions. Dagster creates a default one
# too, but it starts switched off; this one is on as soon as `dagster dev` or the daemon runs.
lake_automation_sensor = AutomationConditionSensorDefinition(
    "lake_automation",
    target=AssetSelection.groups("silver", "gold"),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=10,
    description="Materializes trajectories and transitions as soon as their upstream tables change.",
)


def pending(lake: Lake, table: str, topic: str, hints: dict[int, int], consumer: Any | None = None) -> bool:
    """Whether the broker holds records the table does not hold yet.

    First the end hints (ListOffsets): ``hint > next offset the lake expects`` means records are
    missing. A hint can only say yes: Kafka's end offset is the next offset, Tansu's memory engine
    reports the last batch's base, and its s3 engine (the durable local broker) reports 1 whatever
    the log holds. So when no hint says yes and a ``consumer`` is given, the log itself is asked:
    a fetch at the lake's next offset of each partition that returns a record means there is work.
    """
    _, where = positions(lake.table(table), topic, sorted(hints))
    starts = {p: where[p].kafka_start or 0 for p in hints}
    for p, end in hints.items():
        # in the broker's offsets: after an accepted log reset, the lake's offsets are shifted by a base
        if end > starts[p]:
            return True
    return consumer is not None and bool(starts) and records_at(consumer, topic, starts)


def records_at(consumer: Any, topic: str, starts: dict[int, int], *, timeout_s: float = 1.5) -> bool:
    """Whether a fetch at ``starts`` (partition -> offset) returns any record within ``timeout_s``.

    ``consumer`` is a group-less kafka-python consumer (``KafkaResource.consumer``); it is reassigned here.
    An offset past the log's end (a log that went back) resets to the earliest record, so it
    answers yes and the ingestion run reports the reset.
    """
    from kafka import TopicPartition

    tps = {p: TopicPartition(topic, p) for p in starts}
    consumer.assign(list(tps.values()))
    for p, tp in tps.items():
        consumer.seek(tp, starts[p])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(consumer.poll(timeout_ms=250, max_records=1).values()):
            return True
    return False


@sensor(
    job=lake_job,
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Starts one run of bronze -> silver -> gold when the span or reward topic has records the lake does not "
        "hold, or when rollouts waiting for a reward passed the reward horizon."
    ),
)
def kafka_sensor(
    context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource, credit: CreditResource
) -> SensorResult:
    k = kafka.settings()
    the_lake = lake.lake()
    with kafka.consumer() as consumer:
        hints = {
            "spans": end_offsets_hint(consumer, k.spans_topic),
            "rewards": end_offsets_hint(consumer, k.rewards_topic),
        }
        seen = json.loads(context.cursor) if context.cursor else {}
        now = {t: {str(p): o for p, o in h.items()} for t, h in hints.items()}
        # the hints cannot be trusted to move (see `pending`): without a sign from them, fetch
        new = now != seen or any(
            pending(the_lake, t, k.spans_topic if t == "spans" else k.rewards_topic, h, consumer)
            for t, h in hints.items()
        )
    committed = {
        t: the_lake.txns(t, [app_id(k.spans_topic if t == "spans" else k.rewards_topic, p) for p in h])
        for t, h in hints.items()
    }
    cursor = json.dumps(now, sort_keys=True)
    if not new:
        # no new data, but rollouts waiting for a reward may have passed `credit.reward_horizon_s`
        due = horizon_due(the_lake, credit.settings())
        if due is not None:
            return SensorResult(run_requests=[RunRequest(run_key=f"horizon-{due}")], cursor=cursor)
        return SensorResult(skip_reason=SkipReason("no new records"), cursor=cursor)
    key = hashlib.sha1(json.dumps([now, committed], sort_keys=True).encode()).hexdigest()[:16]
    return SensorResult(run_requests=[RunRequest(run_key=key)], cursor=cursor)


@op(
    description=(
        "Delete rows past each table's retention (lake.retention_days, recorded in `deletions`), cluster by "
        "rollout id the days out of the hourly compaction's window, then compact small files and vacuum files "
        "older than the vacuum retention, table by table."
    )
)
def compact_and_vacuum(context: OpExecutionContext, lake: LakeResource) -> None:
    done = maintain(lake.lake(), lake.retention_days, window=lake.compact_days, log=context.log.info)
    context.add_output_metadata(
        {
            "rows_deleted": sum(done.deleted.values()),
            "days_clustered": sum(len(days) for days in done.clustered.values()),
            "files_compacted": sum(done.compacted.values()),
            "files_vacuumed": sum(done.vacuumed.values()),
        }
    )


@job(description="Nightly Delta maintenance.")
def maintenance_job() -> None:
    compact_and_vacuum()


nightly_maintenance = ScheduleDefinition(
    job=maintenance_job, cron_schedule="0 3 * * *", default_status=DefaultScheduleStatus.RUNNING
)


@op(
    description=(
        "Compact the newest day partitions (lake.compact_days) of spans, rewards, trajectories, "
        "transitions and its credit variants: the small files each lake run adds to the current day."
    )
)
def compact_recent_days(context: OpExecutionContext, lake: LakeResource) -> None:
    done = compact_recent(lake.lake(), days=lake.compact_days, log=context.log.info)
    context.add_output_metadata(
        {
            "days": ", ".join(d.isoformat() for d in sorted(done.days)),
            "files_removed": sum(done.files_removed.values()),
            "files_added": sum(done.files_added.values()),
            "refused": ", ".join(sorted(done.refused)) or "none",
        }
    )


@job(description="Hourly compaction of the days still being written.")
def compact_recent_job() -> None:
    compact_recent_days()


def compaction_schedule() -> ScheduleDefinition:
    """Compact the recent days on the cron in `lake.compact_cron` (running by default).

    A `lake` run committing to the same day at that moment makes one of the two commits be refused:
    the compaction retries on the newer snapshot (``Lake.compact``); a refused run's increment is
    taken by the next run, since each step starts from the positions its table recorded. No row is
    lost or doubled. Skipping hours with a run in flight was not done: under steady traffic some
    run is nearly always in flight, and the hour would never come.
    """
    from schemas.config import load_settings

    return ScheduleDefinition(
        name="hourly_compaction",
        job=compact_recent_job,
        cron_schedule=load_settings().lake.compact_cron,
        default_status=DefaultScheduleStatus.RUNNING,
    )


def new_transitions(settings: Settings) -> tuple[int, int | None]:
    """(transitions no version trained on yet, newest table version): what the next round would take
    (with policy lines per agent, ``trainer.agents``: the most any line's round would take)."""
    from trainer.lines import count_pending_lines

    return count_pending_lines(settings)


@sensor(
    job=policy_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Trains a new policy version once `trainer.min_new_transitions` new transitions exist.",
)
def enough_transitions_sensor(context: SensorEvaluationContext, trainer: TrainerResource) -> SensorResult | SkipReason:
    settings = trainer.settings()
    n, end = new_transitions(settings)
    if n < settings.trainer.min_new_transitions:
        return SkipReason(f"{n} new transitions, waiting for {settings.trainer.min_new_transitions}")
    return SensorResult(run_requests=[RunRequest(run_key=f"transitions-v{end}")])


def training_schedule() -> ScheduleDefinition:
    """Retrain on the cron in `trainer.schedule` (off until enabled in the UI; the sensor is on)."""
    from schemas.config import load_settings

    return ScheduleDefinition(
        name="train_on_schedule",
        job=policy_job,
        cron_schedule=load_settings().trainer.schedule,
        default_status=DefaultScheduleStatus.STOPPED,
    )
