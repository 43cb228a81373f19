"""The smoke round (``--smoke``): bring the stack up, push synthetic traces through it, no model.

It proves every hop of the data path on the real parts (OTel SDK exporter -> collector -> Kafka ->
Dagster assets -> Delta -> DuckDB) and leaves queryable tables behind. The asset run goes through
the same Dagster instance (``DAGSTER_HOME``) that `dagster dev` serves, so it shows up in the UI.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from agentlake.stack import local
from examples.closed_loop.assets import materialize_all
from schemas import attributes as attr
from schemas.config import Settings


@dataclass(frozen=True)
class SyntheticRollout:
    rollout_id: str
    task_id: str
    reward: float
    calls: int


@dataclass
class SmokeReport:
    stack: list[local.PartStatus]
    rollouts_sent: int
    tables: pa.Table
    reward_by_task: pa.Table
    seconds: float


def run_smoke_demo(settings: Settings, *, on_step: Callable[[str], None] = lambda _m: None) -> SmokeReport:
    """up -> synthetic rollouts over OTLP -> Dagster assets -> DuckDB; the caller takes the stack down."""
    from pipelines.lake.query import list_tables, run_query
    from schemas.lake import Lake

    started = time.monotonic()
    stack = local.up(settings, on_step=lambda part: on_step(f"starting {part}"))
    bootstrap = local.bootstrap_servers(settings)
    assert bootstrap is not None
    on_step("sending synthetic agent traces through OTLP/HTTP")
    rollouts = emit_synthetic_rollouts(settings)
    on_step("materializing spans -> rewards -> trajectories -> transitions in Dagster")
    materialize_all(settings, bootstrap)
    env = local.child_env(settings, bootstrap)  # the lake as the stack's children see it (object store or folder)
    lake = Lake(env["AGENTLAKE_LAKE"], json.loads(env["AGENTLAKE_LAKE__STORAGE_OPTIONS"]))
    infos = list_tables(lake)
    tables = pa.table(
        {
            "table": [i.name for i in infos],
            "rows": [i.rows for i in infos],
            "version": [i.version for i in infos],
        }
    )
    reward_by_task = run_query(
        lake,
        "SELECT task_id, count(*) AS rollouts, round(avg(final_reward), 3) AS mean_reward, "
        "sum(n_llm_calls) AS llm_calls FROM trajectories GROUP BY task_id ORDER BY task_id",
    )
    return SmokeReport(stack, len(rollouts), tables, reward_by_task, time.monotonic() - started)


def emit_synthetic_rollouts(
    settings: Settings, *, n_tasks: int = 4, per_task: int = 4, seed: int = 0
) -> list[SyntheticRollout]:
    """Send rollouts (a root span, 1-3 LLM calls with token ids, a reward span) through OTLP/HTTP."""
    rng = random.Random(seed)
    c = settings.collector
    token = next(iter(c.auth_tokens), None)
    exporter = OTLPSpanExporter(
        endpoint=f"http://{c.host}:{c.http_port}/v1/traces",
        headers={"Authorization": f"Bearer {token}"} if token else None,
    )
    provider = TracerProvider(resource=Resource.create({attr.SERVICE_NAME: "agentlake-smoke"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("agentlake.smoke")
    out = []
    for t in range(n_tasks):
        task_id = f"smoke-task-{t}"
        for _ in range(per_task):
            rollout_id = uuid.uuid4().hex
            ids = {attr.ROLLOUT_ID: rollout_id, attr.TASK_ID: task_id, attr.AGENT_NAME: "smoke-agent"}
            calls = rng.randint(1, 3)
            reward = float(rng.random() < 0.5)
            with tracer.start_as_current_span(attr.ROLLOUT_SPAN_NAME, attributes=ids) as root:
                prompt = [rng.randint(10, 1000) for _ in range(12)]
                for step in range(calls):
                    completion = [rng.randint(10, 1000) for _ in range(rng.randint(3, 8))]
                    with tracer.start_as_current_span(
                        "chat smoke-policy",
                        attributes={
                            **ids,
                            attr.GEN_AI_OPERATION_NAME: "chat",
                            attr.GEN_AI_REQUEST_MODEL: "smoke-policy",
                            attr.LLM_PROMPT_TOKEN_IDS: prompt,
                            attr.LLM_COMPLETION_TOKEN_IDS: completion,
                            attr.LLM_COMPLETION_LOGPROBS: [-rng.random() for _ in completion],
                            attr.LLM_POLICY_VERSION: "base",
                            attr.LLM_RESPONSE_ID: f"chatcmpl-{rollout_id[:8]}-{step}",
                        },
                    ):
                        pass
                    prompt = prompt + completion + [rng.randint(10, 1000) for _ in range(4)]
                with tracer.start_as_current_span(attr.REWARD_SPAN_NAME, attributes={**ids, attr.REWARD_VALUE: reward}):
                    pass
                root.set_attribute(attr.ROLLOUT_STATUS, "finished")
            out.append(SyntheticRollout(rollout_id, task_id, reward, calls))
    provider.force_flush()
    provider.shutdown()
    return out
