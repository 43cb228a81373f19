"""A smoke round through the running stack, with no model: synthetic agent traces in, tables out.

Used by the main command until (and besides) the closed-loop demo: it proves the whole data path
(OTel SDK exporter -> collector -> Kafka -> Dagster assets -> Delta -> DuckDB) on the real parts.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from schemas import attributes as attr
from schemas.config import Settings


@dataclass(frozen=True)
class SyntheticRollout:
    rollout_id: str
    task_id: str
    reward: float
    calls: int


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
