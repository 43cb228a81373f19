"""The span the gateway writes for each LLM call, built straight as OTLP protobuf.

The gateway is part of the collectors, so it does not export to itself over the network: it
hands a ready Kafka record (same shape as any received span record) to the sink.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collectors.records import Record, split_traces
from schemas import attributes as A
from schemas.topics import DEFAULT_TENANT

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
SERVICE_NAME = A.GATEWAY_SERVICE_NAME


def parse_traceparent(value: str | None) -> tuple[bytes, bytes] | None:
    """(trace id, parent span id) from a W3C ``traceparent`` header, or None when absent/invalid."""
    m = _TRACEPARENT.match((value or "").strip().lower())
    if not m or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
        return None
    return bytes.fromhex(m.group(1)), bytes.fromhex(m.group(2))


def new_ids() -> tuple[bytes, bytes]:
    return os.urandom(16), os.urandom(8)


def traceparent(trace_id: bytes, span_id: bytes) -> str:
    return f"00-{trace_id.hex()}-{span_id.hex()}-01"


def _value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, list | tuple):
        out = AnyValue()
        out.array_value.values.extend(_value(x) for x in v)
        return out
    text = str(v)
    if not text.isascii():  # a lone surrogate (JSON may carry "\ud800") is no UTF-8: protobuf refuses it
        text = text.encode("utf-8", "replace").decode("utf-8")
    return AnyValue(string_value=text)


@dataclass
class LlmCall:
    """What the gateway learned about one call (one choice of it), to become one span."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes | None
    start_ns: int
    end_ns: int = 0
    operation: str = "chat"
    upstream: str = ""
    status_code: int = 200
    error: str | None = None
    streamed: bool = False
    request_model: str | None = None
    request_messages: Any = None
    request_tools: Any = None  # the request's `tools` (OpenAI tool objects), recorded as agentlake.llm.tools
    response_model: str | None = None
    response_id: str | None = None
    adapter: str | None = None
    policy_version: str | None = None
    policy_sha256: str | None = None  # the served adapter's manifest sha256 (collectors.gateway.recording)
    prompt_token_ids: Sequence[int] | None = None
    completion_token_ids: Sequence[int] | None = None
    completion_logprobs: Sequence[float] | None = None
    output_message: Any = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # rollout/attempt/task ids from the caller
    choice_index: int = 0  # which choice of the answer (``n > 1`` asks for several)
    tenant: str = DEFAULT_TENANT  # the caller's, from its bearer token (the Kafka record's tenant header)

    @property
    def call_id(self) -> str | None:
        """This choice's id: the provider's response id, ``#<index>`` added for choices after the first.

        Each choice is its own LLM call, so each needs its own id (the pipeline keeps one call per
        id); the first keeps the provider's id, which clients record and late rewards name.
        """
        if self.response_id is None or self.choice_index == 0:
            return self.response_id
        return f"{self.response_id}#{self.choice_index}"

    def attributes(self) -> dict[str, Any]:
        a: dict[str, Any] = {
            A.GEN_AI_OPERATION_NAME: self.operation,
            A.GEN_AI_SYSTEM: "vllm",
            A.LLM_UPSTREAM: self.upstream,
            A.LLM_LATENCY_MS: round((self.end_ns - self.start_ns) / 1e6, 3),
            A.LLM_STREAMED: self.streamed,
            "http.response.status_code": self.status_code,
            **self.ids,
        }
        optional = {
            A.GEN_AI_REQUEST_MODEL: self.request_model,
            A.GEN_AI_RESPONSE_MODEL: self.response_model,
            A.LLM_SERVED_MODEL: self.response_model,
            A.GEN_AI_RESPONSE_ID: self.response_id,
            A.LLM_RESPONSE_ID: self.call_id,
            A.LLM_CHOICE_INDEX: self.choice_index if self.response_id is not None else None,
            A.LLM_ADAPTER: self.adapter,
            A.LLM_POLICY_VERSION: self.policy_version,
            A.LLM_POLICY_SHA256: self.policy_sha256,
            A.LLM_PROMPT_TOKEN_IDS: list(self.prompt_token_ids) if self.prompt_token_ids is not None else None,
            A.LLM_COMPLETION_TOKEN_IDS: (
                list(self.completion_token_ids) if self.completion_token_ids is not None else None
            ),
            A.LLM_COMPLETION_LOGPROBS: (
                [float(x) for x in self.completion_logprobs] if self.completion_logprobs is not None else None
            ),
            A.GEN_AI_INPUT_MESSAGES: (
                json.dumps(input_messages(self.request_messages)) if self.request_messages is not None else None
            ),
            A.LLM_TOOLS: json.dumps(self.request_tools) if isinstance(self.request_tools, list) else None,
            A.GEN_AI_OUTPUT_MESSAGES: json.dumps([self.output_message]) if self.output_message is not None else None,
            A.GEN_AI_RESPONSE_FINISH_REASONS: [self.finish_reason] if self.finish_reason else None,
            A.GEN_AI_USAGE_INPUT_TOKENS: self.usage.get("prompt_tokens"),
            A.GEN_AI_USAGE_OUTPUT_TOKENS: self.usage.get("completion_tokens"),
        }
        a.update({k: v for k, v in optional.items() if v is not None})
        return a


def input_messages(request: Any) -> list[Any]:
    """The request's messages as a list of chat messages: a completions ``prompt`` (text, texts or token
    ids) becomes user messages, so the span's messages are a list of objects like every other's."""
    if isinstance(request, list) and all(isinstance(m, dict) for m in request):
        return request
    prompts = request if isinstance(request, list) and all(isinstance(p, str) for p in request) else [request]
    return [{"role": "user", "content": p if isinstance(p, str) else json.dumps(p)} for p in prompts]


def span_record(call: LlmCall, *, tenant: str, topic: str, received_at_ns: int) -> Record:
    """The Kafka record holding this call's span."""
    span = Span(
        trace_id=call.trace_id,
        span_id=call.span_id,
        parent_span_id=call.parent_span_id or b"",
        name=A.LLM_CALL_SPAN_NAME,
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=call.start_ns,
        end_time_unix_nano=call.end_ns,
        status=Status(code=Status.STATUS_CODE_ERROR, message=call.error)
        if call.error
        else Status(code=Status.STATUS_CODE_OK),
    )
    span.attributes.extend(KeyValue(key=k, value=_value(v)) for k, v in call.attributes().items())
    return _record([span], tenant=tenant, topic=topic, received_at_ns=received_at_ns)


def rollout_end_record(
    ids: dict[str, str],
    status: str,
    *,
    reward: float | None = None,
    reward_name: str | None = None,
    tenant: str,
    topic: str,
    now_ns: int,
) -> Record:
    """The record that ends a gateway-only rollout: an ``agentlake.rollout`` span with its status.

    ``ids`` carries the rollout id (and attempt / task ids when the calls named them). A reward, when
    given, is an ``agentlake.reward`` child span in the same trace.
    """
    trace_id, span_id = new_ids()
    root = Span(
        trace_id=trace_id,
        span_id=span_id,
        name=A.ROLLOUT_SPAN_NAME,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=now_ns,
        end_time_unix_nano=now_ns,
        status=Status(code=Status.STATUS_CODE_ERROR if status == "failed" else Status.STATUS_CODE_OK),
    )
    root.attributes.extend(KeyValue(key=k, value=_value(v)) for k, v in {**ids, A.ROLLOUT_STATUS: status}.items())
    spans = [root]
    if reward is not None:
        child = Span(
            trace_id=trace_id,
            span_id=new_ids()[1],
            parent_span_id=span_id,
            name=A.REWARD_SPAN_NAME,
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=now_ns,
            end_time_unix_nano=now_ns,
            status=Status(code=Status.STATUS_CODE_OK),
        )
        attrs = {**ids, A.REWARD_VALUE: float(reward), A.REWARD_NAME: reward_name or A.PRIMARY_REWARD_NAME}
        child.attributes.extend(KeyValue(key=k, value=_value(v)) for k, v in attrs.items())
        spans.append(child)
    return _record(spans, tenant=tenant, topic=topic, received_at_ns=now_ns)


def _record(spans: Sequence[Span], *, tenant: str, topic: str, received_at_ns: int) -> Record:
    """One trace's spans as the gateway's Kafka record (resource ``service.name`` = the gateway)."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key=A.SERVICE_NAME, value=AnyValue(string_value=SERVICE_NAME)))
    ss = rs.scope_spans.add()
    ss.scope.name = "agentlake.gateway"
    ss.spans.extend(spans)
    (record,) = split_traces(request, tenant=tenant, topic=topic, received_at_ns=received_at_ns).records
    return record
