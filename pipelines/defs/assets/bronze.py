"""Bronze assets: the span and reward topics, copied into Delta exactly once."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from pipelines.bronze.ingest import ingest
from pipelines.bronze.span_rewards import extract_span_rewards
from pipelines.bronze.workers import ingest_workers
from pipelines.defs.resources import KafkaResource, LakeResource

# One ingestion per table at a time (a pool of one slot, dagster_home/dagster.yaml): the lake's
# commit checks keep two at once exactly-once too, but the loser's run fails. Inside that one step,
# `[ingest] workers` processes share the topic's partitions (pipelines.bronze.workers).
SPANS_POOL = "agentlake-spans"
REWARDS_POOL = "agentlake-rewards"


@asset(group_name="bronze", pool=SPANS_POOL, description="One row per span, decoded from agentlake.spans.v1.")
def spans(context: AssetExecutionContext, lake: LakeResource, kafka: KafkaResource) -> MaterializeResult:
    the_lake = lake.lake()
    res = ingest_workers(
        the_lake,
        kafka.settings(),
        "spans",
        workers=kafka.ingest_workers,
        batch_records=kafka.batch_records,
        decoders=kafka.ingest_decoders,
    )
    context.log.info(f"spans: {res.records} records, {res.rows} rows, {res.quarantined} quarantined")
    meta = res.metadata()
    meta["spans_per_s"] = round(res.rows / res.seconds, 1) if res.seconds else 0.0
    meta["delta_version"] = the_lake.version("spans") or 0
    meta["workers"] = kafka.ingest_workers
    meta["next_offsets"] = MetadataValue.json({str(k): v for k, v in res.next_offsets.items()})
    return MaterializeResult(metadata=meta)


@asset(
    group_name="bronze",
    pool=REWARDS_POOL,
    deps=[spans],
    description="Rewards from reward spans and from late events on agentlake.rewards.v1.",
)
def rewards(context: AssetExecutionContext, lake: LakeResource, kafka: KafkaResource) -> MaterializeResult:
    k, the_lake = kafka.settings(), lake.lake()
    events = ingest(the_lake, k, "rewards", batch_records=kafka.batch_records)  # small events: one worker
    from_spans = extract_span_rewards(the_lake, k.spans_topic)
    context.log.info(f"rewards: {events.rows} events, {from_spans} from spans, {events.quarantined} quarantined")
    meta = events.metadata()
    meta["rows"] = events.rows + from_spans
    meta["from_spans"] = from_spans
    meta["delta_version"] = the_lake.version("rewards") or 0
    return MaterializeResult(metadata=meta)
