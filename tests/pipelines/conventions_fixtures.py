"""Spans made by the real instrumentation libraries around the real OpenAI client, and their decoding.

The model is scripted: an in-process OpenAI-compatible responder (``httpx.MockTransport``) answers
each chat request with a given assistant message, so each span is what the library itself records
for that request and that answer. ``expected`` is the independent reference: the internal message
shape of what the client sent and received, worked out from the request here, not by the decoder.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import openai.resources
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipelines.bronze.decoding import KafkaRecord, SpanBatch


@dataclass(frozen=True)
class Library:
    """One instrumentation library: how to instrument the client, and what its spans keep."""

    name: str
    instrumentor: Callable[[], Any]
    env: dict[str, str]
    arguments_as_objects: bool  # GenAI parts hold tool-call arguments as parsed JSON
    content_parts: bool  # records a user message's list of content parts (v2 drops them)
    tools: bool  # records the request's tool definitions
    missing_ids: bool = True  # records a tool call that has no id (OpenLLMetry drops the whole list: KeyError)


def _openinference() -> Any:
    from openinference.instrumentation.openai import OpenAIInstrumentor

    return OpenAIInstrumentor()


def _openllmetry() -> Any:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    return OpenAIInstrumentor()


def _openai_v2() -> Any:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    return OpenAIInstrumentor()


LIBRARIES = {
    "openinference": Library("openinference", _openinference, {}, False, True, True),
    "openllmetry": Library(
        "openllmetry", _openllmetry, {"TRACELOOP_TRACE_CONTENT": "true"}, True, True, True, missing_ids=False
    ),
    # the official GenAI instrumentation writes gen_ai.input.messages only when asked to, as its docs say
    "openai-v2": Library(
        "openai-v2",
        _openai_v2,
        {
            "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
        },
        True,
        False,
        False,
    ),
}


class Instrumented:
    """A client whose calls the library records into memory; ``call`` returns the span of one call."""

    def __init__(self, library: Library) -> None:
        self.library = library
        self.exporter = InMemorySpanExporter()
        self.reply: dict[str, Any] = {}
        self.client = openai.OpenAI(
            api_key="scripted",
            base_url="http://scripted.invalid/v1",
            http_client=httpx.Client(transport=httpx.MockTransport(self._respond)),
            max_retries=0,
        )

    def _respond(self, request: httpx.Request) -> httpx.Response:
        finish = "tool_calls" if self.reply.get("tool_calls") else "stop"
        return httpx.Response(
            200,
            json={
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "created": 1,
                "model": "scripted",
                "choices": [{"index": 0, "finish_reason": finish, "message": self.reply}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    def call(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], reply: dict[str, Any]) -> ReadableSpan:
        self.exporter.clear()
        self.reply = reply
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        self.client.chat.completions.create(model="scripted", messages=messages, **kwargs)  # type: ignore[arg-type]
        spans = self.exporter.get_finished_spans()
        assert len(spans) == 1, [s.name for s in spans]
        return spans[0]


def _openai_methods() -> dict[tuple[type, str], Any]:
    """Every method of the OpenAI client's resource classes, as it is now."""
    found: dict[tuple[type, str], Any] = {}
    for info in pkgutil.walk_packages(openai.resources.__path__, "openai.resources."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        for cls in list(vars(module).values()):
            if inspect.isclass(cls) and cls.__module__.startswith("openai."):
                found.update({(cls, name): v for name, v in list(vars(cls).items()) if callable(v)})
    return found


@contextmanager
def instrumented(library: Library, monkeypatch: pytest.MonkeyPatch) -> Iterator[Instrumented]:
    """The library instruments the client for the block; its patches are gone after (OpenLLMetry's
    ``uninstrument`` leaves some on openai 3: each method is put back as it was)."""
    for k, v in library.env.items():
        monkeypatch.setenv(k, v)
    inst = Instrumented(library)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(inst.exporter))
    methods = _openai_methods()
    instrumentor = library.instrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield inst
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
        for (cls, name), method in methods.items():
            if vars(cls).get(name) is not method:
                setattr(cls, name, method)


def decode(span: ReadableSpan) -> dict[str, Any]:
    """The span through the real bronze path (OTLP bytes, as the collector writes them) to its `spans` row."""
    batch = SpanBatch()
    assert batch.add(KafkaRecord("agentlake.spans.v1", 0, 0, None, encode_spans([span]).SerializeToString(), [])) == 1
    assert not batch.quarantine, batch.quarantine
    row: dict[str, Any] = batch.to_table().to_pylist()[0]
    return row


# --- the reference: the internal shape of an OpenAI chat history ----------------------------------


def _arguments(text: str, as_objects: bool) -> str:
    if not as_objects:
        return text
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


def expected(messages: list[dict[str, Any]], library: Library) -> list[dict[str, Any]]:
    """What the lake must hold for ``messages`` as the client sent (or received) them."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content)
        e: dict[str, Any] = {"role": m["role"], "content": content}
        if m.get("tool_calls"):
            e["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": _arguments(c["function"]["arguments"], library.arguments_as_objects),
                    },
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            e["tool_call_id"] = m.get("tool_call_id")
        out.append(e)
    return out
