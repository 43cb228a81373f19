"""The OpenAI-compatible gateway: a proxy in front of vLLM that records every call as a span.

Upstream, it always asks vLLM for ``return_token_ids`` and logprobs (and streamed usage); to the
client it returns the normal OpenAI shape, keeping those extras only where the client asked for
them. Each choice of each call becomes one ``agentlake.llm.call`` span in the caller's trace
(``traceparent``), carrying exact token ids, logprobs, served model, adapter and policy version;
with ``n > 1`` each choice is its own call, with its own response id (``<id>#<index>`` after the
first). Spans go to the sink after the response, off the client's latency path; the server puts
a disk spill (collectors.gateway.spill) in front of Kafka, so a call recorded is never lost while
Kafka is away. Upstream errors pass through unchanged. ``pause`` answers new calls 429 +
Retry-After while in-flight calls finish, so weights can be swapped under a quiet server.

A rollout that only the gateway sees (the client names it by header or ``/rollout/{id}/`` path and
sends no ``traceparent``) has no root span of its own, so it runs until ``POST /rollout/{id}/end``
(status, optional reward) or the pipeline's idle timeout ends it.

Callers authenticate with the collector's bearer tokens (collectors.gateway.auth); each call's spans
carry the caller's tenant, and the pipeline keys every rollout by (tenant, rollout id). So a rollout
id is the caller's own: tenant B naming a rollout id tenant A uses (header, path or ``/end``) gets a
rollout of its own under that id, and can neither add calls to A's rollout nor end or reward it.
Bodies over ``gateway.max_body_bytes`` are refused with 413 while being read, never buffered whole.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import PurePath
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors.errors import CollectorError
from collectors.gateway.auth import GatewayAuth
from collectors.gateway.spans import (
    LlmCall,
    new_ids,
    parse_traceparent,
    rollout_end_record,
    span_record,
    traceparent,
)
from collectors.gateway.spill import SpillFull
from collectors.otlp_http import read_body
from collectors.sink import RecordSink
from schemas import attributes as A
from schemas.config import Settings

log = logging.getLogger(__name__)

Kind = Literal["chat", "completions"]
ROLLOUT_HEADER = "x-agentlake-rollout-id"
ATTEMPT_HEADER = "x-agentlake-attempt-id"
TASK_HEADER = "x-agentlake-task-id"
_DROP_HEADERS = {
    "host",
    "content-length",
    "content-encoding",  # the body is parsed here and sent on as plain JSON
    "connection",
    "keep-alive",
    "transfer-encoding",
    "traceparent",
    "tracestate",
    "accept-encoding",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
}
_MODELS_TTL_S = 2.0  # short: a LoRA hot swap under the same name must show up as a new policy version
_MAX_PAUSE_WAIT_S = 3600.0
_ERROR_KINDS = {401: "authentication_error", 403: "permission_error", 413: "request_too_large"}


def openai_error(
    status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def json_response(data: Any) -> Response:
    """A JSON answer that renders whatever the upstream sent (NaN, lone surrogates) instead of failing."""
    return Response(json.dumps(data, separators=(",", ":")), media_type="application/json")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, limit: int, *, optional: bool = False) -> Any | Response:
    """The request's JSON body, reading at most ``limit`` bytes; an error answer otherwise.

    ``optional``: an empty body is ``{}`` (else it is not JSON: 400).
    """
    try:
        raw = await read_body(request, limit)
    except CollectorError as exc:
        message = str(exc)
        if exc.status == 413:
            message = f"request body too large: {exc} (the gateway's gateway.max_body_bytes)"
        return openai_error(exc.status, message, _ERROR_KINDS.get(exc.status, "invalid_request_error"))
    if optional and not raw.strip():
        return {}
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return openai_error(400, f"request body is not valid JSON: {exc}")


def _force(body: dict[str, Any], kind: Kind) -> dict[str, Any]:
    """The upstream request: the client's, plus token ids, logprobs and streamed usage."""
    up = dict(body)
    up["return_token_ids"] = True
    if kind == "chat":
        if not up.get("logprobs"):
            up["logprobs"] = True
    elif up.get("logprobs") is None:
        up["logprobs"] = 0  # vLLM completions: the sampled token's logprob, no alternatives
    if up.get("stream"):
        options = up.get("stream_options")
        up["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return up


class _Asked:
    """Which extras the client itself asked for (those stay in its answer)."""

    def __init__(self, body: dict[str, Any], kind: Kind) -> None:
        self.ids = body.get("return_token_ids") is True
        lp = body.get("logprobs")
        self.logprobs = bool(lp) if kind == "chat" else lp is not None
        options = body.get("stream_options")
        self.usage = isinstance(options, dict) and bool(options.get("include_usage"))

    def strip(self, data: dict[str, Any], *, chunk: bool = False) -> dict[str, Any] | None:
        if chunk and not self.usage and data.get("usage") is not None and not data.get("choices"):
            return None  # the usage-only chunk we asked for on our own behalf
        if chunk and not self.usage:
            data.pop("usage", None)
        if not self.ids:
            data.pop("prompt_token_ids", None)
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if not self.ids:
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            if not self.logprobs and "logprobs" in choice:
                choice["logprobs"] = None
        return data


def _choice_logprobs(choice: dict[str, Any], kind: Kind) -> list[float] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if kind == "chat":
        content = lp.get("content")
        return [float(t["logprob"]) for t in content] if isinstance(content, list) else None
    values = lp.get("token_logprobs")
    return [float(x) if x is not None else float("nan") for x in values] if isinstance(values, list) else None


class _Stream:
    """Accumulates a streamed answer, choice by choice, into what the spans need."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.meta: dict[str, Any] = {}
        self.prompt_ids: list[int] | None = None
        self.choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for k in ("id", "model"):
            if chunk.get(k) and k not in self.meta:
                self.meta[k] = chunk[k]
        if chunk.get("usage"):
            self.meta["usage"] = chunk["usage"]
        if self.prompt_ids is None and isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_ids = chunk["prompt_token_ids"]
        for c in chunk.get("choices") or ():
            if not isinstance(c, dict):
                continue
            acc = self.choices.setdefault(int(c.get("index", 0)), {"ids": [], "lps": [], "text": [], "prompt": None})
            acc["ids"].extend(c.get("token_ids") or ())
            acc["lps"].extend(_choice_logprobs(c, self.kind) or ())
            if isinstance(c.get("prompt_token_ids"), list):
                acc["prompt"] = c["prompt_token_ids"]
            piece = (c.get("delta") or {}).get("content") if self.kind == "chat" else c.get("text")
            if isinstance(piece, str):
                acc["text"].append(piece)
            if c.get("finish_reason"):
                acc["finish"] = c["finish_reason"]

    def as_response(self) -> dict[str, Any]:
        """The equivalent non-streamed answer, so both paths record spans the same way."""
        choices = []
        for i, acc in sorted(self.choices.items()):
            text = "".join(acc["text"])
            choice: dict[str, Any] = {"index": i, "token_ids": acc["ids"], "finish_reason": acc.get("finish")}
            if acc["prompt"] is not None:
                choice["prompt_token_ids"] = acc["prompt"]
            if self.kind == "chat":
                choice["message"] = {"role": "assistant", "content": text}
                choice["logprobs"] = {"content": [{"logprob": x} for x in acc["lps"]]}
            else:
                choice["text"] = text
                choice["logprobs"] = {"token_logprobs": acc["lps"]}
            choices.append(choice)
        return {**self.meta, "prompt_token_ids": self.prompt_ids, "choices": choices}


class Gateway:
    """State of the proxy: upstreams, pause flag, in-flight count, background span writes.

    Spans are handed to ``sink`` once, with no retry: the server gives the disk spill
    (collectors.gateway.spill), which takes every call unless it is full, and retries Kafka itself.
    """

    def __init__(self, settings: Settings, sink: RecordSink, *, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self.sink = sink
        self.auth = GatewayAuth(settings)
        self.max_body_bytes = settings.gateway.max_body_bytes
        if self.max_body_bytes * 2 > settings.kafka.max_message_bytes:
            raise ValueError(
                f"gateway.max_body_bytes ({self.max_body_bytes}) must be at most half of kafka.max_message_bytes "
                f"({settings.kafka.max_message_bytes}): a call's span holds its whole request and the answer"
            )
        self.upstreams = [u.rstrip("/") for u in settings.gateway.upstreams]
        if not self.upstreams:
            raise ValueError("gateway.upstreams is empty: name at least one vLLM server URL")
        self._next = itertools.cycle(range(len(self.upstreams)))
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.gateway.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )
        self.paused = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._background: set[asyncio.Task[None]] = set()
        self._models: dict[str, tuple[float, dict[str, tuple[str | None, str | None]]]] = {}
        self.recorded_spans = 0
        self.record_failures = 0  # calls lost: the spill was full, or the sink refused them

    # --- pause / resume ------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._models.clear()  # weights may have changed while paused

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no call is in flight (within ``timeout_s``)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def _enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    # --- spans -----------------------------------------------------------------------------------
    async def _policy(self, upstream: str, model: str | None) -> tuple[str | None, str | None]:
        """(adapter, policy version) of a served model name, from the upstream's /v1/models.

        An adapter's version is the last part of its path (the trainer saves each version in a
        folder named after it and hot-loads a new path per version); a base model's is its name.
        """
        if not model:
            return None, None
        at, parents = self._models.get(upstream, (0.0, {}))
        if model not in parents or time.monotonic() - at > _MODELS_TTL_S:
            try:
                r = await self.client.get(f"{upstream}/v1/models", timeout=5.0)
                parents = {
                    m["id"]: (m.get("parent"), m.get("root")) for m in r.json().get("data", []) if isinstance(m, dict)
                }
            except (httpx.HTTPError, ValueError, KeyError, AttributeError, TypeError):
                parents = {}
            self._models[upstream] = (time.monotonic(), parents)
        parent, root = parents.get(model, (None, None))
        if parent and root:
            return model, f"{model}@{PurePath(str(root).rstrip('/')).name}"
        return (model if parent else None), model

    def record(self, calls: Sequence[LlmCall]) -> None:
        """Write the spans in the background; shutdown waits for them."""
        task = asyncio.ensure_future(self._record(calls))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record(self, calls: Sequence[LlmCall]) -> None:
        """Hand the calls' spans to the sink: the spill, which keeps them until Kafka has them."""
        try:
            for call in calls:
                call.adapter, call.policy_version = await self._policy(call.upstream, call.response_model)
            topic = self.settings.kafka.spans_topic
            now = time.time_ns()
            records = [span_record(c, tenant=c.tenant, topic=topic, received_at_ns=now) for c in calls]
            await self.sink.send(records)
            self.recorded_spans += len(records)
        except SpillFull as exc:
            self.record_failures += len(calls)
            log.error("%s", exc)
        except Exception:
            self.record_failures += len(calls)
            log.exception("LLM call spans were lost")

    async def end_rollout(self, request: Request, tenant: str) -> Response:
        """``POST /rollout/{id}/end``: end a rollout the gateway alone has seen (the caller's tenant's).

        Body (optional JSON): ``status`` ("finished", the default, or "failed"), ``reward`` (a
        number) and ``reward_name``. The attempt and task come from the same headers as on the
        calls. Calls of this rollout still being recorded go first; the answer comes once the end
        is in the spill.
        """
        body = await read_json(request, self.max_body_bytes, optional=True)
        if isinstance(body, Response):
            return body
        if not isinstance(body, dict):
            return openai_error(400, "request body must be a JSON object")
        status = body.get("status", "finished")
        if status not in ("finished", "failed"):
            return openai_error(400, f'status must be "finished" or "failed", got {status!r}')
        reward = body.get("reward")
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
        ):
            return openai_error(400, f"reward must be a finite number, got {reward!r}")
        reward_name = body.get("reward_name")
        if reward_name is not None and not isinstance(reward_name, str):
            return openai_error(400, "reward_name must be a string")
        ids = self._ids(request)
        pending = set(self._background)
        if pending:
            await asyncio.wait(pending, timeout=30)
        record = rollout_end_record(
            ids,
            status,
            reward=reward,
            reward_name=reward_name,
            tenant=tenant,
            topic=self.settings.kafka.spans_topic,
            now_ns=time.time_ns(),
        )
        try:
            await self.sink.send([record])
        except Exception as exc:  # noqa: BLE001 - the client may retry the end
            log.error("could not record the end of rollout %s: %s", ids[A.ROLLOUT_ID], exc)
            return openai_error(503, f"the end of the rollout was not recorded: {exc}", "unavailable")
        self.recorded_spans += 1
        return JSONResponse({"rollout_id": ids[A.ROLLOUT_ID], "status": status, "reward": reward})

    def _ids(self, request: Request) -> dict[str, str]:
        """Rollout, attempt and task ids the client named (path or headers)."""
        ids = {}
        rollout = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)
        for key, value in (
            (A.ROLLOUT_ID, rollout),
            (A.ATTEMPT_ID, request.headers.get(ATTEMPT_HEADER)),
            (A.TASK_ID, request.headers.get(TASK_HEADER)),
        ):
            if value:
                ids[key] = value
        return ids

    async def close(self) -> None:
        """Wait for span writes, then close the upstream client."""
        if self._background:
            await asyncio.wait(self._background, timeout=60)
        await self.client.aclose()

    # --- proxying ----------------------------------------------------------------------------------
    def _headers(self, request: Request, tp: str) -> dict[str, str]:
        """The client's headers for the upstream, less hop-by-hop ones, ours and our tokens."""
        out = {k: v for k, v in request.headers.items() if k not in _DROP_HEADERS and not k.startswith("x-agentlake-")}
        if self.auth.is_ours(out.get("authorization")):
            del out["authorization"]
        out["traceparent"] = tp
        out["content-type"] = "application/json"
        return out

    def _calls(self, data: dict[str, Any], base: LlmCall, kind: Kind) -> list[LlmCall]:
        choices = [c for c in data.get("choices") or () if isinstance(c, dict)] or [{}]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        calls = []
        for n, choice in enumerate(choices):
            trace_id, span_id = base.trace_id, base.span_id if n == 0 else new_ids()[1]
            prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
            output = choice.get("message") if kind == "chat" else {"role": "assistant", "content": choice.get("text")}
            index = choice.get("index", n)
            ids = choice.get("token_ids") if isinstance(choice.get("token_ids"), list) else None
            own_usage = usage or {}
            if len(choices) > 1 and ids is not None:  # usage counts every choice; each call its own
                own_usage = {**own_usage, "completion_tokens": len(ids)}
            calls.append(
                LlmCall(
                    trace_id=trace_id,
                    span_id=span_id,
                    parent_span_id=base.parent_span_id,
                    start_ns=base.start_ns,
                    end_ns=base.end_ns,
                    operation=base.operation,
                    upstream=base.upstream,
                    streamed=base.streamed,
                    request_model=base.request_model,
                    request_messages=base.request_messages,
                    response_model=data.get("model"),
                    response_id=data.get("id"),
                    prompt_token_ids=prompt if isinstance(prompt, list) else None,
                    completion_token_ids=ids,
                    completion_logprobs=_choice_logprobs(choice, kind),
                    output_message=output,
                    finish_reason=choice.get("finish_reason"),
                    usage=own_usage,
                    ids=base.ids,
                    tenant=base.tenant,
                    choice_index=index if isinstance(index, int) and index >= 0 else n,
                )
            )
        return calls

    async def completion(self, request: Request, kind: Kind, tenant: str) -> Response:
        if self.paused:
            return openai_error(
                429, "the policy is being updated; retry shortly", "rate_limit_error", headers={"Retry-After": "1"}
            )
        body = await read_json(request, self.max_body_bytes)
        if isinstance(body, Response):
            return body
        if not isinstance(body, dict):
            return openai_error(400, "request body must be a JSON object")
        ids = self._ids(request)
        parent = parse_traceparent(request.headers.get("traceparent"))
        trace_id, span_id = new_ids()
        if parent:
            trace_id = parent[0]
        upstream = self.upstreams[next(self._next)]
        base = LlmCall(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent[1] if parent else None,
            start_ns=time.time_ns(),
            operation="chat" if kind == "chat" else "text_completion",
            upstream=upstream,
            streamed=bool(body.get("stream")),
            request_model=body.get("model") if isinstance(body.get("model"), str) else None,
            request_messages=body.get("messages") if kind == "chat" else body.get("prompt"),
            ids=ids,
            tenant=tenant,
        )
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        asked = _Asked(body, kind)
        self._enter()
        streaming = False
        try:
            req = self.client.build_request(
                "POST",
                upstream + path,
                content=json.dumps(_force(body, kind), separators=(",", ":")).encode(),
                headers=self._headers(request, traceparent(trace_id, span_id)),
            )
            try:
                resp = await self.client.send(req, stream=True)
            except httpx.TimeoutException as exc:
                return self._failed(base, 504, f"upstream {upstream} timed out: {exc}")
            except httpx.TransportError as exc:
                return self._failed(base, 502, f"upstream {upstream} is unreachable: {exc}")
            if resp.status_code != 200 or not base.streamed:
                content = await resp.aread()
                await resp.aclose()
                base.end_ns, base.status_code = time.time_ns(), resp.status_code
                media = resp.headers.get("content-type", "application/json")
                if resp.status_code != 200:
                    base.error = content[:500].decode(errors="replace")
                    self.record([base])
                    return Response(content, resp.status_code, media_type=media)  # unchanged
                try:
                    data = json.loads(content)
                except ValueError:
                    base.error = "upstream answered 200 with a body that is not JSON"
                    self.record([base])
                    return Response(content, resp.status_code, media_type=media)
                if not isinstance(data, dict):
                    base.error = "upstream answered 200 with JSON that is not an object"
                    self.record([base])
                    return Response(content, resp.status_code, media_type=media)
                self.record(self._calls(data, base, kind))
                return json_response(asked.strip(data))
            streaming = True
            return StreamingResponse(self._relay(resp, base, kind, asked), media_type="text/event-stream")
        finally:
            if not streaming:
                self._leave()

    def _failed(self, base: LlmCall, status: int, message: str) -> Response:
        base.end_ns, base.status_code, base.error = time.time_ns(), status, message
        self.record([base])
        return openai_error(status, message, "upstream_error")

    async def _relay(self, resp: httpx.Response, base: LlmCall, kind: Kind, asked: _Asked) -> AsyncIterator[bytes]:
        acc = _Stream(kind)
        done = False
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    yield b"data: [DONE]\n\n"
                    continue
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    yield f"data: {payload}\n\n".encode()
                    continue
                if not isinstance(chunk, dict):
                    yield f"data: {payload}\n\n".encode()
                    continue
                if "error" in chunk:
                    base.error = json.dumps(chunk["error"])[:500]
                acc.add(chunk)
                out = asked.strip(chunk, chunk=True)
                if out is not None:
                    yield f"data: {json.dumps(out, separators=(',', ':'))}\n\n".encode()
        finally:
            await resp.aclose()
            base.end_ns = time.time_ns()
            if not done and base.error is None:
                base.error = "stream ended before [DONE] (client or upstream went away)"
            self.record(self._calls(acc.as_response(), base, kind))
            self._leave()

    async def models(self, _: Request) -> Response:
        """The union of every upstream's /v1/models (errors of the first pass through)."""
        data: list[Any] = []
        seen = set()
        single = len(self.upstreams) == 1
        for upstream in self.upstreams:
            try:
                r = await self.client.get(f"{upstream}/v1/models")
            except httpx.HTTPError as exc:
                if single:
                    return openai_error(502, f"upstream {upstream} is unreachable: {exc}", "upstream_error")
                continue
            if r.status_code != 200:
                if single:
                    return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
                continue
            try:
                listed = r.json().get("data", [])
            except (ValueError, AttributeError):
                if single:
                    message = f"upstream {upstream} listed its models in no JSON object"
                    return openai_error(502, message, "upstream_error")
                continue
            for m in listed if isinstance(listed, list) else ():
                if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"] not in seen:
                    seen.add(m["id"])
                    data.append(m)
        return json_response({"object": "list", "data": data})


TenantHandler = Callable[[Request, str], Awaitable[Response]]
Handler = Callable[[Request], Awaitable[Response]]


def create_app(gateway: Gateway) -> Starlette:
    """Routes: OpenAI API (also under /rollout/{id}/) for tenants, admin pause/resume/state, health."""
    auth = gateway.auth

    def tenant_route(handler: TenantHandler) -> Handler:
        """The handler, called with the caller's tenant; 401 when a token is required and missing or unknown."""

        async def route(request: Request) -> Response:
            try:
                tenant = auth.tenant(request.headers.get("authorization"))
            except CollectorError as exc:
                return openai_error(exc.status, str(exc), "authentication_error", {"WWW-Authenticate": "Bearer"})
            return await handler(request, tenant)

        return route

    def admin_route(handler: Handler) -> Handler:
        """The handler, for the admin token only (401 without a token, 403 with another)."""

        async def route(request: Request) -> Response:
            refusal = auth.admin_refusal(request.headers.get("authorization"))
            if refusal is not None:
                headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
                return openai_error(refusal.status, refusal.message, _ERROR_KINDS[refusal.status], headers)
            return await handler(request)

        return route

    async def chat(request: Request, tenant: str) -> Response:
        return await gateway.completion(request, "chat", tenant)

    async def completions(request: Request, tenant: str) -> Response:
        return await gateway.completion(request, "completions", tenant)

    async def models(request: Request, _tenant: str) -> Response:
        return await gateway.models(request)

    async def pause(request: Request) -> Response:
        wait = request.query_params.get("wait")
        seconds = 0.0
        if wait:
            try:
                seconds = float(wait)
            except ValueError:
                seconds = math.nan
            if not 0 <= seconds <= _MAX_PAUSE_WAIT_S:
                return openai_error(400, f"wait must be seconds from 0 to {_MAX_PAUSE_WAIT_S:.0f}, got {wait!r}")
        gateway.pause()
        idle = await gateway.wait_idle(seconds) if wait else True
        return JSONResponse(_state(gateway) | {"idle": idle})

    async def resume(_: Request) -> Response:
        gateway.resume()
        return JSONResponse(_state(gateway))

    async def state(_: Request) -> Response:
        return JSONResponse(_state(gateway))

    async def health(request: Request) -> Response:
        """Liveness for anyone; the full state (upstreams, counters, spill) only where admin is allowed."""
        if auth.admin_refusal(request.headers.get("authorization")) is None:
            return JSONResponse(_state(gateway))
        return JSONResponse({"status": "ok", "paused": gateway.paused})

    routes = [Route("/rollout/{rollout_id}/end", tenant_route(gateway.end_rollout), methods=["POST"])]
    for prefix in ("", "/rollout/{rollout_id}"):
        routes += [
            Route(f"{prefix}/v1/chat/completions", tenant_route(chat), methods=["POST"]),
            Route(f"{prefix}/v1/completions", tenant_route(completions), methods=["POST"]),
            Route(f"{prefix}/v1/models", tenant_route(models), methods=["GET"]),
        ]
    routes += [
        Route("/admin/pause", admin_route(pause), methods=["POST"]),
        Route("/admin/resume", admin_route(resume), methods=["POST"]),
        Route("/admin/state", admin_route(state), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _state(gateway: Gateway) -> dict[str, Any]:
    state = {
        "status": "ok",
        "paused": gateway.paused,
        "in_flight": gateway.in_flight,
        "upstreams": gateway.upstreams,
        "recorded_spans": gateway.recorded_spans,
        "record_failures": gateway.record_failures,
    }
    stats = getattr(gateway.sink, "stats", None)
    if callable(stats):
        state["spill"] = stats()  # records, bytes and calls dropped (a full spill), waiting for Kafka
    return state
