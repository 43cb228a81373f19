"""Silver asset: rollouts assembled from spans and rewards, re-scored when a late reward arrives."""

import time

from dagster import AssetExecutionContext, AutomationCondition, MaterializeResult, asset

from pipelines.defs.assets.bronze import rewards, spans
from pipelines.defs.resources import CreditResource, KafkaResource, LakeResource
from pipelines.silver.trajectories_step import update_trajectories

# New spans or rewards, or every 15 minutes so idle rollouts reach `timed_out` without new data;
# never while a blocking check of the bronze tables (duplicates) is failing.
_CONDITION = (
    AutomationCondition.eager()
    | (AutomationCondition.cron_tick_passed("*/15 * * * *") & ~AutomationCondition.in_progress())
) & AutomationCondition.all_deps_blocking_checks_passed()


@asset(
    group_name="silver",
    deps=[spans, rewards],
    automation_condition=_CONDITION,
    description="One row per rollout attempt: status, calls in order, rewards, final reward.",
)
def trajectories(
    context: AssetExecutionContext, lake: LakeResource, kafka: KafkaResource, credit: CreditResource
) -> MaterializeResult:
    t0 = time.perf_counter()
    c = credit.settings()
    res = update_trajectories(lake.lake(), kafka.settings(), idle_timeout_s=c.idle_timeout_s, reward_name=c.reward)
    context.log.info(f"trajectories: {res.rollouts} rollouts re-assembled")
    meta = res.metadata()
    meta["seconds"] = round(time.perf_counter() - t0, 3)
    return MaterializeResult(metadata=meta)
