"""Kafka topics, record keys and headers: the wire contract between collectors and pipelines."""

from __future__ import annotations

SPANS_TOPIC = "agentlake.spans.v1"
REWARDS_TOPIC = "agentlake.rewards.v1"
MODELS_TOPIC = "agentlake.models.v1"
# Replicas' answers to release commands (MODEL_RELEASE_ACK JSON), keyed by replica name.
MODEL_ACKS_TOPIC = "agentlake.models.acks.v1"
ALL_TOPICS: tuple[str, ...] = (SPANS_TOPIC, REWARDS_TOPIC, MODELS_TOPIC, MODEL_ACKS_TOPIC)

# Headers on every record we produce (values are UTF-8 bytes).
HEADER_TENANT = "agentlake-tenant"
HEADER_SCHEMA_VERSION = "agentlake-schema-version"
HEADER_RECEIVED_AT = "agentlake-received-at"  # integer nanoseconds since the epoch, as text
HEADER_CONTENT_TYPE = "agentlake-content-type"

# Span records: value = an OTLP ExportTraceServiceRequest (protobuf) holding the spans of one
# trace from one request; key = rollout id, else the trace id as 32 lowercase hex digits.
SPANS_CONTENT_TYPE = "application/x-protobuf; otlp=ExportTraceServiceRequest"
# Reward and model records: value = one UTF-8 JSON object matching REWARD_EVENT / MODEL_RELEASE_EVENT /
# MODEL_RELEASE_ACK.
JSON_CONTENT_TYPE = "application/json"

DEFAULT_TENANT = "default"
