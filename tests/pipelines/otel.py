"""Build spans with the real OpenTelemetry SDK and produce them to Kafka the way the collector does."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from schemas import attributes as A
from schemas import topics
from schemas.config import KafkaSettings
from schemas.kafka import kafka_python_config

MS = 1_000_000  # ns


@dataclass
class Call:
    """One LLM call of a scripted rollout."""

    prompt: list[int] | None = None
    response: list[int] | None = None
    logprobs: list[float] | None = None
    messages_in: list[dict[str, str]] | None = None
    messages_out: list[dict[str, str]] | None = None
    agent: str | None = None
    response_id: str | None = None
    reward_after: float | None = None  # an intermediate reward span right after the call
    policy_version: str | None = "v0"
    policy_sha256: str | None = None  # the served adapter's manifest hash, as the gateway records it


@dataclass
class Rollout:
    rollout_id: str | None
    task_id: str | None = None
    attempt_id: str | None = None
    calls: list[Call] = field(default_factory=list)
    final_reward: float | None = None
    status: StatusCode = StatusCode.OK
    agent: str = "solver"
    t0_ns: int = 1_750_000_000_000 * MS // 1000
    style: str = "agentlake"  # or "agentlightning"
    end_root: bool = True
    ids_on_root_only: bool = False  # as Agent Lightning writes them: children carry no rollout id


def make_spans(r: Rollout, *, provider: TracerProvider | None = None) -> list[ReadableSpan]:
    """Spans of one rollout through the SDK: root, one LLM span per call, reward spans."""
    exporter = InMemorySpanExporter()
    tp = provider or TracerProvider(resource=Resource.create({A.SERVICE_NAME: "test-agent"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("agentlake-tests")
    t = r.t0_ns
    root_attrs: dict[str, Any] = {A.AGENT_NAME: r.agent}
    if r.style == "agentlightning":
        root_attrs = {A.OI_AGENT_NAME: r.agent}
        if r.rollout_id:
            root_attrs[A.AGL_ROLLOUT_ID] = r.rollout_id
        if r.attempt_id:
            root_attrs[A.AGL_ATTEMPT_ID] = r.attempt_id
    else:
        if r.rollout_id:
            root_attrs[A.ROLLOUT_ID] = r.rollout_id
        if r.attempt_id:
            root_attrs[A.ATTEMPT_ID] = r.attempt_id
        if r.task_id:
            root_attrs[A.TASK_ID] = r.task_id
    root = tracer.start_span(A.ROLLOUT_SPAN_NAME, start_time=t, attributes=root_attrs)
    ctx = set_span_in_context(root)
    ids = {k: v for k, v in root_attrs.items() if k in (*A.ROLLOUT_ID_KEYS, *A.ATTEMPT_ID_KEYS, A.TASK_ID)}
    if r.ids_on_root_only:
        ids = {}

    def reward(value: float, when: int) -> None:
        if r.style == "agentlightning":
            attrs: dict[str, Any] = {f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_VALUE_SUFFIX}": value}
            name = A.AGL_REWARD_SPAN_NAME
        else:
            attrs = {A.REWARD_VALUE: value, **ids}
            name = A.REWARD_SPAN_NAME
        s = tracer.start_span(name, context=ctx, start_time=when, attributes=attrs)
        s.end(end_time=when + MS)

    for i, c in enumerate(r.calls):
        t += 10 * MS
        attrs = dict(ids)
        if c.agent:
            attrs[A.AGENT_NAME if r.style != "agentlightning" else A.OI_AGENT_NAME] = c.agent
        if r.style == "agentlightning":
            if c.prompt is not None:
                attrs[A.AGL_PROMPT_TOKEN_IDS] = c.prompt
            if c.response is not None:
                attrs[A.AGL_RESPONSE_TOKEN_IDS] = c.response
            name = "openai.chat.completion"
        else:
            if c.prompt is not None:
                attrs[A.LLM_PROMPT_TOKEN_IDS] = c.prompt
            if c.response is not None:
                attrs[A.LLM_COMPLETION_TOKEN_IDS] = c.response
            if c.logprobs is not None:
                attrs[A.LLM_COMPLETION_LOGPROBS] = c.logprobs
            if c.policy_version:
                attrs[A.LLM_POLICY_VERSION] = c.policy_version
            if c.policy_sha256:
                attrs[A.LLM_POLICY_SHA256] = c.policy_sha256
            name = A.LLM_CALL_SPAN_NAME
        if c.messages_in is not None:
            attrs[A.GEN_AI_INPUT_MESSAGES] = json.dumps(c.messages_in)
        if c.messages_out is not None:
            attrs[A.GEN_AI_OUTPUT_MESSAGES] = json.dumps(c.messages_out)
        attrs[A.GEN_AI_RESPONSE_ID] = c.response_id or f"resp-{r.rollout_id}-{r.attempt_id}-{i}"
        attrs["gen_ai.request.temperature"] = 0.8
        s = tracer.start_span(name, context=ctx, start_time=t, attributes=attrs)
        t += 5 * MS
        s.end(end_time=t)
        tool = tracer.start_span("tool.calc", context=ctx, start_time=t + MS, attributes={"tool.name": "calc"})
        tool.end(end_time=t + 2 * MS)
        if c.reward_after is not None:
            reward(c.reward_after, t + 3 * MS)
    t += 10 * MS
    if r.final_reward is not None:
        reward(r.final_reward, t)
    if r.end_root:
        root.set_status(Status(r.status))
        root.end(end_time=t + 5 * MS)
    tp.shutdown()
    return list(exporter.get_finished_spans())


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """Exactly what the collector writes as a record value."""
    return encode_spans(spans).SerializeToString()


def span_record(spans: Sequence[ReadableSpan], key: str | None = None, tenant: str = "default") -> dict[str, Any]:
    trace = format(spans[0].context.trace_id, "032x")
    return {
        "key": (key or trace).encode(),
        "value": encode(spans),
        "headers": [
            (topics.HEADER_TENANT, tenant.encode()),
            (topics.HEADER_SCHEMA_VERSION, b"1"),
            (topics.HEADER_RECEIVED_AT, str(time.time_ns()).encode()),
            (topics.HEADER_CONTENT_TYPE, topics.SPANS_CONTENT_TYPE.encode()),
        ],
    }


def reward_record(event: dict[str, Any], tenant: str = "default") -> dict[str, Any]:
    return {
        "key": str(event.get("rollout_id") or event.get("trace_id") or event.get("response_id")).encode(),
        "value": json.dumps(event).encode(),
        "headers": [
            (topics.HEADER_TENANT, tenant.encode()),
            (topics.HEADER_SCHEMA_VERSION, b"1"),
            (topics.HEADER_RECEIVED_AT, str(time.time_ns()).encode()),
            (topics.HEADER_CONTENT_TYPE, topics.JSON_CONTENT_TYPE.encode()),
        ],
    }


def produce(kafka: KafkaSettings, topic: str, records: Sequence[dict[str, Any]]) -> None:
    """Produce with kafka-python, acks=all, the way the collector does."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka_python_config(kafka), acks="all", linger_ms=5)
    try:
        for rec in records:
            producer.send(topic, key=rec["key"], value=rec["value"], headers=rec["headers"])
        producer.flush(30)
    finally:
        producer.close()
