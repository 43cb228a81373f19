"""The gateway's proxy: OpenAI-compatible calls relayed to vLLM upstreams, each one recorded.

It takes the client's request (bearer token, body under ``gateway.max_body_bytes``, rollout ids from
headers or the ``/rollout/{id}/`` path, ``traceparent``), picks an upstream in turn, sends it what
collectors.gateway.recording makes of the request, and relays the answer: whole, or streamed line by
line as it comes. The recording module decides what the call becomes; this one only moves bytes.
Upstream errors pass through unchanged; an unreachable upstream is 502, a slow one 504. Where vLLM
wants an API key (``vllm.api_key_env``), every upstream request carries it instead of the client's.
``/v1/responses`` (the Responses API) goes the same way, its items and answer made chat-shaped by
collectors.gateway.responses_api; a stream is relayed with its ``event:`` lines.

The agent a call is for (the ``x-agentlake-agent`` header) is recorded on its span; when that agent
has a policy line of its own (``trainer.agents``), a call to ``model.served_name`` is sent to the
line's adapter, ``<served_name>-<agent>`` (``recording.route_model``), and records that line's version.

``pause`` answers new calls 429 + Retry-After while in-flight calls finish, so weights can be
swapped under a quiet server. ``hold`` (the pause's ``restoring`` reason) answers calls to a policy name
(``model.served_name`` and its lines') 503 + Retry-After while a loader loads the registry's serving versions
into a vLLM that came up without them (serving.loader), so agents wait rather than get vLLM's 404; calls to
the base model pass. A rollout that only the gateway sees (the client names it by header
or ``/rollout/{id}/`` path and sends no ``traceparent``) has no root span of its own, so it runs
until ``POST /rollout/{id}/end`` (status, optional reward) or the pipeline's idle timeout ends it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from collectors.gateway import responses_api
from collectors.gateway.auth import GatewayAuth
from collectors.gateway.recording import (
    CallRecorder,
    ClientExtras,
    Kind,
    ServedPolicy,
    StreamedAnswer,
    choice_calls,
    request_call,
    route_model,
    served_policy,
    upstream_body,
)
from collectors.gateway.replies import json_response, openai_error, read_json
from collectors.gateway.spans import LlmCall, parse_traceparent, traceparent
from collectors.sink import RecordSink
from schemas import attributes as A
from schemas.config import Settings
from schemas.manifest import ManifestHashes

log = logging.getLogger(__name__)

ROLLOUT_HEADER = "x-agentlake-rollout-id"
ATTEMPT_HEADER = "x-agentlake-attempt-id"
TASK_HEADER = "x-agentlake-task-id"
# The calling agent's name: recorded on the call's span (agentlake.agent.name) and, when the agent has a
# policy line of its own (trainer.agents), a call to model.served_name is served by that line's adapter.
AGENT_HEADER = "x-agentlake-agent"
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


class Gateway:
    """State of the proxy: upstreams, pause flag, in-flight count, and the ``recorder`` of its calls.

    ``sink`` is where the recorder writes: the server gives the disk spill (collectors.gateway.spill).
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
        self.served_name = settings.model.served_name
        self.lines = list(settings.trainer.agents)  # agents with a policy line of their own
        self.upstreams = [u.rstrip("/") for u in settings.gateway.upstreams]
        if not self.upstreams:
            raise ValueError("gateway.upstreams is empty: name at least one vLLM server URL")
        self._next = itertools.cycle(range(len(self.upstreams)))
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.gateway.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )
        self.paused = False
        self.restoring = settings.gateway.hold_until_restored  # policy names answer 503 until a loader restores
        self.retry_after_s = settings.gateway.restoring_retry_after_s
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._models: dict[str, tuple[float, dict[str, tuple[str | None, str | None]]]] = {}
        # vLLM's --api-key (vllm.api_key_env): every upstream request carries it, in place of the client's own
        key = settings.vllm.api_key()
        self.upstream_auth = {"authorization": f"Bearer {key}"} if key else {}
        self._manifests = ManifestHashes()
        self.recorder = CallRecorder(sink, topic=settings.kafka.spans_topic, policy=self._policy)

    # --- pause / resume ------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._models.clear()  # weights may have changed while paused

    def hold(self) -> None:
        """Answer policy-name calls 503 until ``release``: vLLM lacks the registry's versions (serving.loader)."""
        self.restoring = True

    def release(self) -> None:
        self.restoring = False
        self._models.clear()  # the adapters were loaded again, maybe from other folders

    def is_policy(self, model: object) -> bool:
        """Whether ``model`` names a policy (the single one or a line's), not the base model."""
        return isinstance(model, str) and (model == self.served_name or model.startswith(f"{self.served_name}-"))

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

    # --- served models ----------------------------------------------------------------------------
    async def _policy(self, upstream: str, model: str | None) -> ServedPolicy:
        """What serves a model name, from the upstream's /v1/models (cached briefly) and the adapter's
        folder on this host (its manifest hash, re-read when the file changes)."""
        if not model:
            return ServedPolicy(None, None)
        at, parents = self._models.get(upstream, (0.0, {}))
        if model not in parents or time.monotonic() - at > _MODELS_TTL_S:
            try:
                r = await self.client.get(f"{upstream}/v1/models", timeout=5.0, headers=self.upstream_auth)
                parents = {
                    m["id"]: (m.get("parent"), m.get("root")) for m in r.json().get("data", []) if isinstance(m, dict)
                }
            except (httpx.HTTPError, ValueError, KeyError, AttributeError, TypeError):
                parents = {}
            self._models[upstream] = (time.monotonic(), parents)
        return served_policy(model, parents, hashes=self._manifests)

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
        try:
            await self.recorder.end_rollout(ids, status, reward=reward, reward_name=reward_name, tenant=tenant)
        except Exception as exc:  # noqa: BLE001 - the client may retry the end
            log.error("could not record the end of rollout %s: %s", ids[A.ROLLOUT_ID], exc)
            return openai_error(503, f"the end of the rollout was not recorded: {exc}", "unavailable")
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
        await self.recorder.close()
        await self.client.aclose()

    # --- proxying ----------------------------------------------------------------------------------
    def _headers(self, request: Request, tp: str) -> dict[str, str]:
        """The client's headers for the upstream, less hop-by-hop ones, ours and our tokens."""
        out = {k: v for k, v in request.headers.items() if k not in _DROP_HEADERS and not k.startswith("x-agentlake-")}
        if self.auth.is_ours(out.get("authorization")):
            del out["authorization"]
        out.update(self.upstream_auth)
        out["traceparent"] = tp
        out["content-type"] = "application/json"
        return out

    async def _admit(self, request: Request) -> tuple[dict[str, Any], dict[str, str]] | Response:
        """(the body for the upstream, the call's ids), or the answer refusing the call: paused, holding
        the policy names, a body that is no JSON object."""
        if self.paused:
            return openai_error(
                429, "the policy is being updated; retry shortly", "rate_limit_error", headers={"Retry-After": "1"}
            )
        body = await read_json(request, self.max_body_bytes)
        if isinstance(body, Response):
            return body
        if not isinstance(body, dict):
            return openai_error(400, "request body must be a JSON object")
        body, agent = route_model(
            body, request.headers.get(AGENT_HEADER), served_name=self.served_name, lines=self.lines
        )
        if self.restoring and self.is_policy(body.get("model")):
            return openai_error(
                503,
                f"{body['model']} is being loaded again after vLLM restarted; retry shortly",
                "unavailable",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        ids = self._ids(request)
        if agent:
            ids[A.AGENT_NAME] = agent
        return body, ids

    async def completion(self, request: Request, kind: Kind, tenant: str) -> Response:
        admitted = await self._admit(request)
        if isinstance(admitted, Response):
            return admitted
        body, ids = admitted
        upstream = self.upstreams[next(self._next)]
        base = request_call(
            body,
            kind,
            parent=parse_traceparent(request.headers.get("traceparent")),
            upstream=upstream,
            ids=ids,
            tenant=tenant,
        )
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        asked = ClientExtras(body, kind)
        self._enter()
        streaming = False
        try:
            resp = await self._send(request, base, upstream + path, upstream_body(body, kind))
            if isinstance(resp, Response):
                return resp
            if resp.status_code != 200 or not base.streamed:
                content, media = await self._whole(resp, base)
                if resp.status_code != 200:
                    base.error = content[:500].decode(errors="replace")
                    self.recorder.record([base])
                    return Response(content, resp.status_code, media_type=media)  # unchanged
                try:
                    data = json.loads(content)
                except ValueError:
                    base.error = "upstream answered 200 with a body that is not JSON"
                    self.recorder.record([base])
                    return Response(content, resp.status_code, media_type=media)
                if not isinstance(data, dict):
                    base.error = "upstream answered 200 with JSON that is not an object"
                    self.recorder.record([base])
                    return Response(content, resp.status_code, media_type=media)
                self.recorder.record(choice_calls(data, base, kind))
                return json_response(asked.strip(data))
            streaming = True
            return StreamingResponse(self._relay(resp, base, kind, asked), media_type="text/event-stream")
        finally:
            if not streaming:
                self._leave()

    async def responses(self, request: Request, tenant: str) -> Response:
        """``POST /v1/responses`` (the OpenAI Responses API): relayed like a chat call and recorded as one,
        its items in chat form (collectors.gateway.responses_api), with vLLM's exact token ids."""
        admitted = await self._admit(request)
        if isinstance(admitted, Response):
            return admitted
        body, ids = admitted
        refusal = responses_api.problem(body)
        if refusal is not None:
            return openai_error(400, refusal)
        upstream = self.upstreams[next(self._next)]
        base = request_call(
            body,
            "chat",
            parent=parse_traceparent(request.headers.get("traceparent")),
            upstream=upstream,
            ids=ids,
            tenant=tenant,
        )
        base.request_messages = responses_api.input_messages(body)
        base.request_tools = responses_api.chat_tools(body.get("tools"))
        asked = body.get("enable_response_messages") is True
        self._enter()
        streaming = False
        try:
            resp = await self._send(request, base, upstream + "/v1/responses", responses_api.upstream_body(body))
            if isinstance(resp, Response):
                return resp
            if resp.status_code != 200 or not base.streamed:
                content, media = await self._whole(resp, base)
                try:
                    data = json.loads(content) if resp.status_code == 200 else None
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    base.error = content[:500].decode(errors="replace") or f"upstream answered {resp.status_code}"
                    self.recorder.record([base])
                    return Response(content, resp.status_code, media_type=media)  # unchanged
                self.recorder.record([responses_api.answered_call(data, base)])
                return json_response(responses_api.strip(data, asked=asked))
            streaming = True
            return StreamingResponse(self._relay_events(resp, base, asked), media_type="text/event-stream")
        finally:
            if not streaming:
                self._leave()

    async def _send(
        self, request: Request, base: LlmCall, url: str, payload: dict[str, Any]
    ) -> httpx.Response | Response:
        """POST ``payload`` to ``url``, the answer streamed; a timeout is 504 and an unreachable upstream
        502, each recorded as the call's failure."""
        req = self.client.build_request(
            "POST",
            url,
            content=json.dumps(payload, separators=(",", ":")).encode(),
            headers=self._headers(request, traceparent(base.trace_id, base.span_id)),
        )
        upstream = base.upstream
        try:
            return await self.client.send(req, stream=True)
        except httpx.TimeoutException as exc:
            return self._failed(base, 504, f"upstream {upstream} timed out: {exc}")
        except httpx.TransportError as exc:
            return self._failed(base, 502, f"upstream {upstream} is unreachable: {exc}")

    @staticmethod
    async def _whole(resp: httpx.Response, base: LlmCall) -> tuple[bytes, str]:
        """The whole body of an answer not relayed as a stream, and its media type; the call ends here."""
        content = await resp.aread()
        await resp.aclose()
        base.end_ns, base.status_code = time.time_ns(), resp.status_code
        return content, resp.headers.get("content-type", "application/json")

    async def _relay_events(self, resp: httpx.Response, base: LlmCall, asked: bool) -> AsyncIterator[bytes]:
        """A Responses stream relayed line by line (``event:`` lines too); the call is recorded from the
        answer its last event (``response.completed``) carries whole."""
        final: dict[str, Any] | None = None
        try:
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    try:
                        event = json.loads(line[5:].strip())
                    except ValueError:
                        event = None
                    if isinstance(event, dict):
                        final = responses_api.completed(event) or final
                        if isinstance(event.get("response"), dict):
                            event["response"] = responses_api.strip(dict(event["response"]), asked=asked)
                        if event.get("type") == "error":
                            base.error = json.dumps(event)[:500]
                        line = "data: " + json.dumps(event, separators=(",", ":"))
                yield f"{line}\n".encode()
        finally:
            await resp.aclose()
            base.end_ns = time.time_ns()
            if final is None:
                base.error = base.error or "stream ended before response.completed (client or upstream went away)"
                self.recorder.record([base])
            else:
                self.recorder.record([responses_api.answered_call(final, base)])
            self._leave()

    def _failed(self, base: LlmCall, status: int, message: str) -> Response:
        base.end_ns, base.status_code, base.error = time.time_ns(), status, message
        self.recorder.record([base])
        return openai_error(status, message, "upstream_error")

    async def _relay(
        self, resp: httpx.Response, base: LlmCall, kind: Kind, asked: ClientExtras
    ) -> AsyncIterator[bytes]:
        acc = StreamedAnswer(kind)
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
            self.recorder.record(choice_calls(acc.as_response(), base, kind))
            self._leave()

    async def models(self, _: Request) -> Response:
        """The union of every upstream's /v1/models (errors of the first pass through)."""
        data: list[Any] = []
        seen = set()
        single = len(self.upstreams) == 1
        for upstream in self.upstreams:
            try:
                r = await self.client.get(f"{upstream}/v1/models", headers=self.upstream_auth)
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
