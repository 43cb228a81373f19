"""Silver asset: the reward functions named in settings (and the LLM judge, when on), scored over
trajectories into `rewards`."""

import time

from dagster import AssetExecutionContext, AutomationCondition, Config, MaterializeResult, asset

from pipelines.defs.assets.silver import trajectories
from pipelines.defs.resources import CreditResource, LakeResource
from pipelines.silver.judging.judge import LlmJudge
from pipelines.silver.reward_functions import AnyRewardFunction, load, score_trajectories


class RewardFunctionsConfig(Config):
    """``backfill``: score every finished trajectory again, not only those no version has scored."""

    backfill: bool = False


@asset(
    group_name="silver",
    deps=[trajectories],
    automation_condition=AutomationCondition.eager() & AutomationCondition.all_deps_blocking_checks_passed(),
    description="Scores of the `[credit] reward_modules` functions and the `[judge]` LLM judge (source "
    "fn:<name>@<version>) in `rewards`, attached to their trajectories.",
)
def reward_functions(
    context: AssetExecutionContext, config: RewardFunctionsConfig, lake: LakeResource, credit: CreditResource
) -> MaterializeResult:
    t0 = time.perf_counter()
    settings = credit.settings()
    fns: list[AnyRewardFunction] = list(load(settings.reward_modules))
    judge_settings = credit.judge_settings()
    judge = LlmJudge(judge_settings, lake.lake(), log=context.log.warning) if judge_settings else None
    if judge is not None:
        fns.append(judge)
    try:
        res = score_trajectories(lake.lake(), fns, chosen=settings.reward, backfill=config.backfill)
    finally:
        if judge is not None:
            judge.close()
    context.log.info(f"reward functions: {res.scored} scored, {res.rollouts_updated} rollouts updated")
    meta = res.metadata()
    meta["functions"] = ", ".join(f"{f.name}@{f.version}" for f in fns)
    if judge is not None:
        meta |= judge.stats.metadata()
    meta["seconds"] = round(time.perf_counter() - t0, 3)
    return MaterializeResult(metadata=meta)
