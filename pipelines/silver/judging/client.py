"""The judge's one HTTP call: ``POST /v1/chat/completions`` on vLLM itself.

Judging is not training data, so it must leave no trace an agent's call would: the request goes to
the model server directly, never through the agentlake gateway (which records every call it proxies
as spans, that is, as trajectories), and it is made with OpenTelemetry instrumentation suppressed for
its duration, so an instrumented HTTP client in the process (``opentelemetry-instrument``, an agent
SDK loaded beside the pipeline) emits no span for it either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from opentelemetry import context as otel_context

from pipelines.errors import JudgeUnavailableError


class JudgeClient:
    """Chat completions from one model on one OpenAI-compatible server (vLLM), with no spans."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key_env: str = "",
        timeout_s: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = url.rstrip("/")
        self.model = model
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers, transport=transport)

    def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        schema: Mapping[str, Any] | None = None,
    ) -> str:
        """The model's answer to ``messages``; with ``schema``, constrained to it (vLLM structured output)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "judgement", "schema": dict(schema), "strict": True},
            }
        token = otel_context.attach(otel_context.set_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            resp = self.http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise JudgeUnavailableError(
                f"judge: the model server at {self.url} is unreachable ({type(exc).__name__}: {exc}); "
                "start vLLM (`agentlake up --vllm`) or set [judge] url"
            ) from exc
        finally:
            otel_context.detach(token)
        if resp.status_code >= 400:
            hint = " (a server without structured output: set [judge] guided = false)" if schema is not None else ""
            raise JudgeUnavailableError(
                f"judge: {self.url} answered {resp.status_code} for model {self.model!r}{hint}: {resp.text[:300]}"
            )
        try:
            return str(resp.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeUnavailableError(f"judge: {self.url} sent no chat completion: {resp.text[:300]}") from exc

    def close(self) -> None:
        self.http.close()
