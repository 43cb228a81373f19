"""The `policy` asset: train one version on new transitions and republish it to vLLM.

A thin shell over ``trainer.round.train_once`` and ``trainer.publish.Publisher``; the metadata
(loss, KL, reward, tokens/s, publish latency) is numeric so Dagster plots it across versions.
"""

import time

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from pipelines.assets.gold import transitions
from pipelines.resources import TrainerResource

# Where a Kubernetes deployment (deploy/helm: K8sRunLauncher) trains: a pod with one GPU, on a node that
# has one (the label NVIDIA's GPU feature discovery sets), tolerating the usual GPU taint. The run launcher
# reads it from the run's tags (the `train` job carries them), the k8s_job_executor from the step's; the
# local launchers ignore it. `agentlake/gpu` is what the run queue limits (deploy/dagster.yaml).
GPU_K8S_CONFIG = {
    "container_config": {"resources": {"limits": {"nvidia.com/gpu": 1}}},
    "pod_spec_config": {
        "node_selector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}
GPU_TAGS = {"dagster-k8s/config": GPU_K8S_CONFIG, "agentlake/gpu": "1"}


@asset(
    group_name="policy",
    deps=[transitions],
    op_tags=GPU_TAGS,
    description="A new policy version trained on the transitions since the last one, published to vLLM.",
)
def policy(context: AssetExecutionContext, trainer: TrainerResource) -> MaterializeResult:
    from trainer.publish import Publisher
    from trainer.round import train_once

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
