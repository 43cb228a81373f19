"""The `policy` asset: train one version on new transitions and republish it to vLLM.

A thin shell over ``trainer.lines.train_lines`` (one round per agent's policy line when
``trainer.agents`` lists some, else ``trainer.round.train_once`` for the single policy; with
``trainer.nproc`` > 1 as a data-parallel torchrun job, ``trainer.distributed.launch``) and
``serving.publish.gated_publisher`` (the publisher the CLI's publish builds too), gated on ``trainer.eval_tasks``
and restarting vLLM on full weights through ``vllm.restart_command``; the metadata (loss, KL, reward, tokens/s,
publish latency, eval scores) is numeric so Dagster plots it across versions, prefixed ``<agent>/`` per line;
``tracking_run`` links the round's run in the experiment tracker (``trainer.trackers``, MLflow by default), ``viewer``
the version's page in the trajectory viewer (``[viewer]``).
"""

import time
from typing import TYPE_CHECKING, Any

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from pipelines.defs.assets.gold import transitions
from pipelines.defs.resources import TrainerResource

if TYPE_CHECKING:
    from schemas.config import Settings
    from trainer.round import RoundResult

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
    from trainer.distributed import train_rounds

    settings = trainer.settings()
    t0 = time.perf_counter()
    # one round per agent's policy line (trainer.agents), else the single policy; with trainer.nproc > 1
    # a data-parallel torchrun job, its log in this run's
    results = train_rounds(settings, echo=context.log.info)
    if len(results) == 1 and results[0].agent is None:
        return MaterializeResult(metadata=_round(context, trainer, settings, results[0], t0))
    meta: dict[str, Any] = {"trained": False}
    for result in results:
        one = _round(context, trainer, settings, result, t0)
        meta["trained"] = bool(meta["trained"] or one["trained"])
        meta.update({f"{result.agent}/{k}": v for k, v in one.items()})
    return MaterializeResult(metadata=meta)


def _round(
    context: AssetExecutionContext, trainer: TrainerResource, settings: "Settings", result: "RoundResult", t0: float
) -> dict[str, Any]:
    """One line's round as metadata; its new version published when the resource says so."""
    from serving.publish import gated_publisher

    line = f"{result.agent}: " if result.agent else ""
    if result.version is None:
        context.log.info(f"{line}no new version: {result.reason}")
        return {"trained": False, "reason": result.reason, "n_transitions": result.n_transitions}
    meta: dict[str, Any] = {
        "trained": True,
        "version": result.version,
        "parent_version": result.parent_version or "-",
        "n_transitions": result.n_transitions,
        "transitions_versions": f"{result.version_start + 1 if result.version_start is not None else 0}"
        f"..{result.version_end}",
        "train_seconds": round(time.perf_counter() - t0, 2),
        "path": MetadataValue.path(result.path or ""),
    }
    meta["viewer"] = MetadataValue.url(settings.viewer.link(f"/versions/{result.version}"))  # its page
    if result.tracking_url:  # the round's run in MLflow (or a TensorBoard/W&B folder): trainer.trackers
        meta["tracking_run"] = MetadataValue.url(result.tracking_url)
    meta.update({k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)})
    if trainer.publish:
        # the gate (trainer.eval_tasks) and, for full weights, the deployment's vllm.restart_command
        published = gated_publisher(settings).publish(result.version)
        meta.update(publish_status=published.status, publish_seconds=round(published.seconds, 3))
        meta.update({f"eval_{k}": v for k, v in published.scores.items()})
        from trainer.trackers import log_eval

        numeric = {k.removeprefix("eval_"): v for k, v in published.comparison.items() if isinstance(v, int | float)}
        log_eval(result.tracking_url, {**published.scores, **numeric})  # beside the round's curves
        meta.update(published.comparison)  # the paired difference, its interval and verdict (serving.evaluation)
        scores = ", ".join(f"{k} {v:.3f}" for k, v in published.scores.items())
        context.log.info(f"{line}{result.version}: {published.status} in {published.seconds:.2f}s {scores}".strip())
    return meta
