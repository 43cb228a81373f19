"""What a proxied LLM call becomes: the request vLLM gets, the answer the client gets, the calls recorded.

Upstream, the gateway always asks vLLM for ``return_token_ids`` and logprobs (and streamed usage);
to the client it returns the normal OpenAI shape, keeping those extras only where the client asked
for them. Each choice of each call becomes one ``agentlake.llm.call`` span in the caller's trace
(``traceparent``), carrying exact token ids, logprobs, served model, adapter, policy version and
the adapter's manifest hash (``served_policy``); with ``n > 1`` each choice is its own call, with
its own response id (``<id>#<index>`` after the first). Spans go to the sink after the response,
off the client's latency path.

Kept apart from the HTTP transport (collectors.gateway.proxy and .routes), so each rule is a plain
function or class over request/response dicts, tested without a server: ``upstream_body``,
``ClientExtras``, ``StreamedAnswer`` (a stream gathered into the non-streamed shape), ``route_model`` (which
agent's policy line serves a call),
``request_call`` / ``choice_calls``, ``served_policy``; ``CallRecorder`` hands the calls to the span
builder (collectors.gateway.spans) and the sink.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import PurePath
from typing import Any, Literal, NamedTuple

from collectors.gateway.spans import LlmCall, new_ids, rollout_end_record, span_record
from collectors.gateway.spill import SpillFull
from collectors.sink import RecordSink
from schemas.manifest import ManifestHashes

log = logging.getLogger(__name__)

Kind = Literal["chat", "completions"]


class ServedPolicy(NamedTuple):
    """What served a call: the adapter's name, the policy version, the sha256 of the adapter's manifest."""

    adapter: str | None
    version: str | None
    sha256: str | None = None  # None: not an adapter, or its folder's manifest is not readable here


# What served a model name on one upstream
PolicyLookup = Callable[[str, str | None], Awaitable[ServedPolicy]]


def route_model(
    body: dict[str, Any], agent: str | None, *, served_name: str, lines: Sequence[str]
) -> tuple[dict[str, Any], str | None]:
    """(the body vLLM gets, the agent the call is for): a call to the single policy ``served_name`` from an
    agent with a policy line of its own (``trainer.agents``) goes to that line, ``<served_name>-<agent>``.

    The agent is the one the client named (the ``x-agentlake-agent`` header), else the one whose line the
    request's ``model`` names; a model that is neither, or an agent with no line, is left as it is.
    """
    model = body.get("model")
    if not agent and isinstance(model, str):
        agent = next((a for a in lines if model == f"{served_name}-{a}"), None)
    if agent and agent in lines and model == served_name:
        return {**body, "model": f"{served_name}-{agent}"}, agent
    return body, agent or None


def upstream_body(body: dict[str, Any], kind: Kind) -> dict[str, Any]:
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


class ClientExtras:
    """Which extras the client itself asked for (those stay in its answer)."""

    def __init__(self, body: dict[str, Any], kind: Kind) -> None:
        self.ids = body.get("return_token_ids") is True
        lp = body.get("logprobs")
        self.logprobs = bool(lp) if kind == "chat" else lp is not None
        options = body.get("stream_options")
        self.usage = isinstance(options, dict) and bool(options.get("include_usage"))

    def strip(self, data: dict[str, Any], *, chunk: bool = False) -> dict[str, Any] | None:
        """The answer (or stream ``chunk``) less the extras the client did not ask for; None: skip it."""
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


def choice_logprobs(choice: dict[str, Any], kind: Kind) -> list[float] | None:
    """The sampled tokens' logprobs of one choice (chat or completions shape), or None."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if kind == "chat":
        content = lp.get("content")
        return [float(t["logprob"]) for t in content] if isinstance(content, list) else None
    values = lp.get("token_logprobs")
    return [float(x) if x is not None else float("nan") for x in values] if isinstance(values, list) else None


def _add_tool_call_delta(calls: dict[int, dict[str, Any]], delta: dict[str, Any], position: int) -> None:
    """One streamed tool-call delta into the calls so far, by its ``index``: the first delta of a call
    names it (id, type, function name), later ones add pieces of its arguments."""
    index = delta.get("index")
    key = index if isinstance(index, int) else position
    call = calls.setdefault(key, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    if isinstance(delta.get("id"), str):
        call["id"] = delta["id"]
    if isinstance(delta.get("type"), str):
        call["type"] = delta["type"]
    raw_fn = delta.get("function")
    fn: dict[str, Any] = raw_fn if isinstance(raw_fn, dict) else {}
    if isinstance(fn.get("name"), str):
        call["function"]["name"] += fn["name"]
    if isinstance(fn.get("arguments"), str):
        call["function"]["arguments"] += fn["arguments"]


class StreamedAnswer:
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
            acc = self.choices.setdefault(
                int(c.get("index", 0)), {"ids": [], "lps": [], "text": [], "prompt": None, "reasoning": [], "calls": {}}
            )
            acc["ids"].extend(c.get("token_ids") or ())
            acc["lps"].extend(choice_logprobs(c, self.kind) or ())
            if isinstance(c.get("prompt_token_ids"), list):
                acc["prompt"] = c["prompt_token_ids"]
            raw_delta = c.get("delta")
            delta: dict[str, Any] = raw_delta if isinstance(raw_delta, dict) else {}
            piece = delta.get("content") if self.kind == "chat" else c.get("text")
            if isinstance(piece, str):
                acc["text"].append(piece)
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str):
                acc["reasoning"].append(thought)
            for n, call in enumerate(delta.get("tool_calls") or ()):
                if isinstance(call, dict):
                    _add_tool_call_delta(acc["calls"], call, n)
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
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if acc["calls"]:  # as vLLM answers unstreamed: the calls in order, no text as null content
                    message["content"] = text or None
                    message["tool_calls"] = [acc["calls"][k] for k in sorted(acc["calls"])]
                if acc["reasoning"]:
                    message["reasoning_content"] = "".join(acc["reasoning"])
                choice["message"] = message
                choice["logprobs"] = {"content": [{"logprob": x} for x in acc["lps"]]}
            else:
                choice["text"] = text
                choice["logprobs"] = {"token_logprobs": acc["lps"]}
            choices.append(choice)
        return {**self.meta, "prompt_token_ids": self.prompt_ids, "choices": choices}


def request_call(
    body: dict[str, Any],
    kind: Kind,
    *,
    parent: tuple[bytes, bytes] | None,
    upstream: str,
    ids: dict[str, str],
    tenant: str,
) -> LlmCall:
    """The call as the request names it (answer still unknown): in the caller's trace when ``parent``."""
    trace_id, span_id = new_ids()
    if parent:
        trace_id = parent[0]
    return LlmCall(
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


def choice_calls(data: dict[str, Any], base: LlmCall, kind: Kind) -> list[LlmCall]:
    """One recorded call per choice of the answer ``data``; the first keeps ``base``'s span id."""
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
                completion_logprobs=choice_logprobs(choice, kind),
                output_message=output,
                finish_reason=choice.get("finish_reason"),
                usage=own_usage,
                ids=base.ids,
                tenant=base.tenant,
                choice_index=index if isinstance(index, int) and index >= 0 else n,
            )
        )
    return calls


def served_policy(
    model: str | None,
    listed: Mapping[str, tuple[str | None, str | None]],
    *,
    hashes: ManifestHashes | None = None,
) -> ServedPolicy:
    """What serves a model name, given the upstream's models as {id: (parent, root)}.

    An adapter's version is the last part of its path (the trainer saves each version in a
    folder named after it and hot-loads a new path per version); a base model's is its name.
    With ``hashes``, an adapter's root folder is read for its ``manifest.json``: the gateway runs
    beside vLLM, so the folder vLLM loaded is on this host, and the manifest's sha256 is the
    registry's ``manifest_sha256`` of the version those files are. A name alone says what the
    files were called; the hash says which files they were.
    """
    if not model:
        return ServedPolicy(None, None)
    parent, root = listed.get(model, (None, None))
    if parent and root:
        sha = hashes.sha256(root) if hashes is not None else None
        return ServedPolicy(model, f"{model}@{PurePath(str(root).rstrip('/')).name}", sha)
    return ServedPolicy(model if parent else None, model)


class CallRecorder:
    """Writes recorded calls as spans to ``sink``, in the background; counts what was kept and lost.

    Spans are handed to ``sink`` once, with no retry: the server gives the disk spill
    (collectors.gateway.spill), which takes every call unless it is full, and retries Kafka itself.
    ``policy`` names each call's adapter, policy version and adapter hash from its upstream and served model.
    """

    def __init__(self, sink: RecordSink, *, topic: str, policy: PolicyLookup) -> None:
        self.sink = sink
        self.topic = topic
        self.policy = policy
        self.pending: set[asyncio.Task[None]] = set()
        self.recorded_spans = 0
        self.record_failures = 0  # calls lost: the spill was full, or the sink refused them

    def record(self, calls: Sequence[LlmCall]) -> None:
        """Write the spans in the background; ``close`` waits for them."""
        task = asyncio.ensure_future(self._write(calls))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _write(self, calls: Sequence[LlmCall]) -> None:
        """Hand the calls' spans to the sink: the spill, which keeps them until Kafka has them."""
        try:
            for call in calls:
                call.adapter, call.policy_version, call.policy_sha256 = await self.policy(
                    call.upstream, call.response_model
                )
            now = time.time_ns()
            records = [span_record(c, tenant=c.tenant, topic=self.topic, received_at_ns=now) for c in calls]
            await self.sink.send(records)
            self.recorded_spans += len(records)
        except SpillFull as exc:
            self.record_failures += len(calls)
            log.error("%s", exc)
        except Exception:
            self.record_failures += len(calls)
            log.exception("LLM call spans were lost")

    async def end_rollout(
        self,
        ids: dict[str, str],
        status: str,
        *,
        reward: float | None,
        reward_name: str | None,
        tenant: str,
    ) -> None:
        """Write the end of a rollout once the calls still being recorded are written; raises what the sink raises."""
        pending = set(self.pending)
        if pending:
            await asyncio.wait(pending, timeout=30)
        record = rollout_end_record(
            ids,
            status,
            reward=reward,
            reward_name=reward_name,
            tenant=tenant,
            topic=self.topic,
            now_ns=time.time_ns(),
        )
        await self.sink.send([record])
        self.recorded_spans += 1

    async def close(self) -> None:
        """Wait for the span writes still under way."""
        if self.pending:
            await asyncio.wait(self.pending, timeout=60)
