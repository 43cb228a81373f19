"""Gold asset: credit-assigned transitions, the trainer's input (read with deltalake, not via Dagster)."""

import time

from dagster import AssetExecutionContext, AutomationCondition, MaterializeResult, asset

from pipelines.defs.assets.reward_functions import reward_functions
from pipelines.defs.assets.silver import trajectories
from pipelines.defs.resources import CreditResource, LakeResource, TokenizerResource
from pipelines.gold.transitions_step import update_transitions


@asset(
    group_name="gold",
    deps=[trajectories, reward_functions],
    automation_condition=AutomationCondition.eager() & AutomationCondition.all_deps_blocking_checks_passed(),
    description="One row per LLM call of a finished trajectory, with reward, return and advantage.",
)
def transitions(
    context: AssetExecutionContext, lake: LakeResource, credit: CreditResource, tokenizer: TokenizerResource
) -> MaterializeResult:
    t0 = time.perf_counter()
    settings = credit.settings()
    res = update_transitions(
        lake.lake(), settings, retokenizer=tokenizer.retokenizer, verifier=tokenizer.verifier(settings)
    )
    context.log.info(f"transitions: {res.rows} rows from {res.rollouts} rollouts")
    meta = res.metadata()
    meta["seconds"] = round(time.perf_counter() - t0, 3)
    return MaterializeResult(metadata=meta)
