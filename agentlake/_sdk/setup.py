"""``agentlake.init``: the tracer provider that sends this process's spans to the collector.

Apart from ``tracing`` (rollouts, rewards, the provider's state) so that neither ``tracing`` nor
``openai`` (the client hooks, which read the provider) imports the other.
"""

from __future__ import annotations

import os
from typing import Literal

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from agentlake._sdk import openai as openai_hooks
from agentlake._sdk.global_provider import install_global
from agentlake._sdk.tracing import DEFAULT_ENDPOINT, RolloutStamper, state
from schemas import attributes as A


def init(
    endpoint: str | None = None,
    *,
    protocol: Literal["http", "grpc"] = "http",
    service_name: str | None = None,
    agent_name: str | None = None,
    token: str | None = None,
    exporter: SpanExporter | None = None,
    batch: bool = True,
    instrument_openai: bool = True,
    set_global: bool = True,
) -> TracerProvider:
    """Send this process's spans to the agentlake collector.

    ``endpoint`` is the collector's base URL (default ``$AGENTLAKE_ENDPOINT`` or
    http://127.0.0.1:4318; for gRPC, host:port of port 4317). ``token`` becomes the bearer token
    that maps to your tenant. ``exporter`` replaces the OTLP exporter (tests, other backends).
    With ``set_global`` (the default), tracers taken from OpenTelemetry's global provider write to
    this provider, and to the next one if ``init`` is called again; the previous provider is shut down.
    """
    endpoint = (endpoint or os.environ.get("AGENTLAKE_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if exporter is None:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            target = endpoint.split("://", 1)[-1]
            exporter = GrpcExporter(endpoint=target, insecure=not endpoint.startswith("https"), headers=headers)
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

            exporter = HttpExporter(endpoint=f"{endpoint}/v1/traces", headers=headers)
    resource = Resource.create(
        {
            A.SERVICE_NAME: service_name or agent_name or "agentlake-agent",
            **({A.AGENT_NAME: agent_name} if agent_name else {}),
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(RolloutStamper())
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    if state.provider is not None:
        state.provider.shutdown()
    state.provider, state.endpoint, state.headers, state.agent_name = provider, endpoint, headers, agent_name
    if set_global:
        install_global(provider)  # once per process; later inits re-point it (see global_provider)
    if instrument_openai:
        openai_hooks.instrument_openai()
    return provider
