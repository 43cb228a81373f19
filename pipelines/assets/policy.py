"""The `policy` asset: train one version on new transitions and republish it to vLLM.

A thin shell over ``trainer.run.train_once`` and ``trainer.publish.Publisher``; the metadata
(loss, KL, reward, tokens/s, publish latency) is numeric so Dagster plots it across versions.
"""

import time

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from pipelines.assets.gold import transitions
from pipelines.resources import TrainerResource


@asset(
    group_name="policy",
    deps=[transitions],
    description="A new policy version trained on the transitions since the last one, published to vLLM.",
)
def policy(context: AssetExecutionContext, trainer: TrainerResource) -> MaterializeResult:
    from trainer.publish import Publisher
    from trainer.run import train_once

    settings = trainer.settings()
    t0 = time.perf_counter()
    result = train_once(settings)
    if result.version is None:
        context.log.info(f"no new version: {result.reason}")
        meta = {"trained": False, "reason": result.reason, "n_transitions": result.n_transitions}
        return MaterializeResult(metadata=meta)
    meta: dict[str, object] = {
        "trained": True,
        "version": result.version,
        "parent_version": result.parent_version or "-",
        "n_transitions": result.n_transitions,
        "transitions_versions": f"{result.version_start + 1 if result.version_start is not None else 0}"
        f"..{result.version_end}",
        "train_seconds": round(time.perf_counter() - t0, 2),
        "path": MetadataValue.path(result.path or ""),
    }
    meta.update({k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)})
    if trainer.publish:
        published = Publisher.from_settings(settings).publish(result.version)
        meta.update(publish_status=published.status, publish_seconds=round(published.seconds, 3))
        context.log.info(f"{result.version}: {published.status} in {published.seconds:.2f}s")
    return MaterializeResult(metadata=meta)
