"""Instrumentation of the OpenAI Python client: every completion becomes an ``agentlake.llm.call`` span.

When the client talks to vLLM (any base URL that is not api.openai.com) the call also asks for
``return_token_ids`` and logprobs, and the span records the exact prompt and completion token ids
and logprobs, so training needs no retokenization. What the caller did not ask for is removed
from the answer again. The call's ``traceparent`` is sent along, so a gateway in between records
its span as a child of ours; so are the current rollout's ids and the agent's name
(``tracing.rollout_headers``: ``x-agentlake-agent`` makes the gateway serve the call from that
agent's policy line). A header the caller set (``extra_headers``, or the client's ``default_headers``)
is kept as it is. None of ours go to api.openai.com.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import inject

from agentlake._sdk.tracing import TRACER_NAME, rollout_headers, tracer_provider
from schemas import attributes as A
from schemas.chat_messages import StreamedReply, reply_message

_PATCHED = "__agentlake_patched__"


def _self_hosted(client: Any) -> bool:
    """Whether ``client`` talks to vLLM or the agentlake gateway (any base URL but api.openai.com)."""
    base = str(getattr(client, "base_url", ""))
    return "api.openai.com" not in base


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def _logprobs(choice: Any, chat: bool) -> list[float] | None:
    lp = _get(choice, "logprobs")
    if lp is None:
        return None
    if chat:
        content = _get(lp, "content")
        return [float(_get(t, "logprob")) for t in content] if content else None
    values = _get(lp, "token_logprobs")
    return [float(x) for x in values] if values else None


def _prepare(kwargs: dict[str, Any], client: Any, chat: bool, span: trace.Span) -> tuple[bool, bool]:
    """Ask for ids and logprobs and name the rollout and agent (vLLM or the gateway only), and send ``span``
    as the parent; return what the caller asked for."""
    extra = dict(kwargs.get("extra_body") or {})
    asked_ids = extra.get("return_token_ids") is True
    asked_lp = bool(kwargs.get("logprobs")) if chat else kwargs.get("logprobs") is not None
    headers = dict(kwargs.get("extra_headers") or {})
    if _self_hosted(client):
        extra["return_token_ids"] = True
        kwargs["extra_body"] = extra
        if not asked_lp:
            kwargs["logprobs"] = True if chat else 0
        given = {str(k).lower() for k in (*headers, *(getattr(client, "default_headers", None) or {}))}
        headers.update({k: v for k, v in rollout_headers().items() if k not in given})
    inject(headers, context=trace.set_span_in_context(span))  # a gateway's span becomes a child of this call's
    kwargs["extra_headers"] = headers
    return asked_ids, asked_lp


def _finish(span: trace.Span, result: Any, chat: bool, asked_lp: bool, started: float) -> None:
    """Put what the response says on the span, then tidy the response for the caller."""
    span.set_attribute(A.LLM_LATENCY_MS, round((time.perf_counter() - started) * 1000, 3))
    model, rid = _get(result, "model"), _get(result, "id")
    if model:
        span.set_attribute(A.GEN_AI_RESPONSE_MODEL, model)
        span.set_attribute(A.LLM_SERVED_MODEL, model)
    if rid:
        span.set_attribute(A.GEN_AI_RESPONSE_ID, rid)
        span.set_attribute(A.LLM_RESPONSE_ID, rid)
    usage = _get(result, "usage")
    if usage is not None:
        for key, attr in (
            ("prompt_tokens", A.GEN_AI_USAGE_INPUT_TOKENS),
            ("completion_tokens", A.GEN_AI_USAGE_OUTPUT_TOKENS),
        ):
            if _get(usage, key) is not None:
                span.set_attribute(attr, int(_get(usage, key)))
    choices = _get(result, "choices") or []
    prompt_ids = _get(result, "prompt_token_ids")
    if choices:
        first = choices[0]
        prompt_ids = prompt_ids or _get(first, "prompt_token_ids")
        ids = _get(first, "token_ids")
        if ids:
            span.set_attribute(A.LLM_COMPLETION_TOKEN_IDS, [int(x) for x in ids])
        lps = _logprobs(first, chat)
        if lps:
            span.set_attribute(A.LLM_COMPLETION_LOGPROBS, lps)
        if _get(first, "finish_reason"):
            span.set_attribute(A.GEN_AI_RESPONSE_FINISH_REASONS, [str(_get(first, "finish_reason"))])
        span.set_attribute(A.GEN_AI_OUTPUT_MESSAGES, json.dumps([_output_message(first, chat)]))
        if not asked_lp:
            for c in choices:
                if hasattr(c, "logprobs"):
                    c.logprobs = None
    if prompt_ids:
        span.set_attribute(A.LLM_PROMPT_TOKEN_IDS, [int(x) for x in prompt_ids])


def _as_dict(obj: Any) -> dict[str, Any] | None:
    """An OpenAI response object (pydantic, extra fields included) or a dict, as a dict."""
    if obj is None or isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    return dump() if callable(dump) else None


def _output_message(choice: Any, chat: bool) -> dict[str, Any]:
    """The reply as one assistant message in the lake's shape (`schemas.chat_messages`)."""
    if not chat:
        return reply_message(None, text=_get(choice, "text"))
    return reply_message(_as_dict(_get(choice, "message")) or {})


def _start(kwargs: dict[str, Any], chat: bool) -> trace.Span:
    tracer = tracer_provider().get_tracer(TRACER_NAME)
    span = tracer.start_span(A.LLM_CALL_SPAN_NAME, kind=trace.SpanKind.CLIENT)
    span.set_attribute(A.GEN_AI_OPERATION_NAME, "chat" if chat else "text_completion")
    if isinstance(kwargs.get("model"), str):
        span.set_attribute(A.GEN_AI_REQUEST_MODEL, kwargs["model"])
    inputs = kwargs.get("messages") if chat else kwargs.get("prompt")
    try:
        span.set_attribute(A.GEN_AI_INPUT_MESSAGES, json.dumps(inputs, default=str))
        if chat and kwargs.get("tools"):
            span.set_attribute(A.GEN_AI_TOOL_DEFINITIONS, json.dumps(kwargs["tools"], default=str))
    except (TypeError, ValueError):
        pass
    return span


def _mark_failed(span: trace.Span, error: BaseException) -> None:
    """Record the error on the span and mark it failed, so a broken call is visible in the trace."""
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)[:200]))


class _StreamRecorder:
    """Collects token ids and logprobs from streamed chunks; ends the span at the end of the stream."""

    def __init__(self, span: trace.Span, chat: bool, started: float) -> None:
        self.span, self.chat, self.started = span, chat, started
        self.meta: dict[str, Any] = {"choices": [{"token_ids": [], "logprobs": None, "text": []}]}
        self.lps: list[float] = []
        self.reply = StreamedReply()
        self.done = False

    def add(self, chunk: Any) -> None:
        for key in ("id", "model", "usage", "prompt_token_ids"):
            if _get(chunk, key) is not None and self.meta.get(key) is None:
                self.meta[key] = _get(chunk, key)
        for c in _get(chunk, "choices") or []:
            if (_get(c, "index") or 0) != 0:
                continue
            self.meta["choices"][0]["token_ids"].extend(_get(c, "token_ids") or [])
            self.lps.extend(_logprobs(c, self.chat) or [])
            if self.chat:
                self.reply.add(_as_dict(_get(c, "delta")) or {})
            elif _get(c, "text"):
                self.meta["choices"][0]["text"].append(_get(c, "text"))
            if _get(c, "finish_reason"):
                self.meta["choices"][0]["finish_reason"] = _get(c, "finish_reason")

    def end(self, error: BaseException | None = None) -> None:
        if self.done:
            return
        self.done = True
        first = self.meta["choices"][0]
        text = "".join(first.pop("text")) if not self.chat else None
        first["message"] = self.reply.message()
        first["text"] = text
        first["logprobs"] = {"content": [{"logprob": x} for x in self.lps], "token_logprobs": self.lps}
        _finish(self.span, self.meta, self.chat, True, self.started)
        self.span.set_attribute(A.LLM_STREAMED, True)
        if error is not None:
            _mark_failed(self.span, error)
        self.span.end()

    @contextlib.contextmanager
    def reading(self, stop: type[Exception]) -> Iterator[None]:
        """Guard one read of the stream: ``stop`` ends the span, any other failure ends it with the error.

        Sync and async streams share this; the exception still reaches the caller.
        """
        try:
            yield
        except stop:
            self.end()
            raise
        except Exception as exc:
            self.end(exc)
            raise


class _SyncStream:
    def __init__(self, inner: Any, rec: _StreamRecorder) -> None:
        self._inner, self._rec = inner, rec

    def __iter__(self) -> _SyncStream:
        return self

    def __next__(self) -> Any:
        with self._rec.reading(StopIteration):
            chunk = next(self._inner)
        self._rec.add(chunk)
        return chunk

    def __enter__(self) -> _SyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._rec.end()
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncStream:
    def __init__(self, inner: Any, rec: _StreamRecorder) -> None:
        self._inner, self._rec = inner, rec

    def __aiter__(self) -> _AsyncStream:
        return self

    async def __anext__(self) -> Any:
        with self._rec.reading(StopAsyncIteration):
            chunk = await self._inner.__anext__()
        self._rec.add(chunk)
        return chunk

    async def __aenter__(self) -> _AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._rec.end()
        await self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Call:
    """One instrumented ``create`` call: the span and what ending it needs, shared by sync and async wrappers."""

    def __init__(self, client: Any, kwargs: dict[str, Any], chat: bool) -> None:
        self.span = _start(kwargs, chat)
        _, self.asked_lp = _prepare(kwargs, client, chat, self.span)
        self.started = time.perf_counter()
        self.chat = chat
        self.stream = bool(kwargs.get("stream"))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Make the span current while the client runs; a failure marks the span failed and ends it."""
        try:
            # the error is recorded once, below, not by use_span as well
            with trace.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield
        except Exception as exc:
            _mark_failed(self.span, exc)
            self.span.end()
            raise

    def done(self, result: Any, stream_cls: type[_SyncStream] | type[_AsyncStream]) -> Any:
        """End the span on the response, or hand a stream back wrapped so its end ends the span."""
        if self.stream:
            return stream_cls(result, _StreamRecorder(self.span, self.chat, self.started))
        _finish(self.span, result, self.chat, self.asked_lp, self.started)
        self.span.end()
        return result


def _patched(create: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Dress ``create`` as ``original`` and remember it, so patching is idempotent and can be undone."""
    functools.update_wrapper(create, original)
    setattr(create, _PATCHED, original)
    return create


def _wrap_sync(original: Callable[..., Any], chat: bool) -> Callable[..., Any]:
    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _Call(self._client, kwargs, chat)
        with call.running():
            result = original(self, *args, **kwargs)
        return call.done(result, _SyncStream)

    return _patched(create, original)


def _wrap_async(original: Callable[..., Any], chat: bool) -> Callable[..., Any]:
    async def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _Call(self._client, kwargs, chat)
        with call.running():
            result = await original(self, *args, **kwargs)
        return call.done(result, _AsyncStream)

    return _patched(create, original)


def instrument_openai() -> bool:
    """Patch ``openai``'s chat and text completion ``create`` (sync and async); False if openai is absent."""
    try:
        from openai.resources import completions as text
        from openai.resources.chat import completions as chat
    except ImportError:
        return False
    for module, is_chat in ((chat, True), (text, False)):
        for cls, wrapper in ((module.Completions, _wrap_sync), (module.AsyncCompletions, _wrap_async)):
            if not hasattr(cls.create, _PATCHED):
                cls.create = wrapper(cls.create, is_chat)
    return True


def uninstrument_openai() -> None:
    """Undo ``instrument_openai``."""
    try:
        from openai.resources import completions as text
        from openai.resources.chat import completions as chat
    except ImportError:
        return
    for module in (chat, text):
        for cls in (module.Completions, module.AsyncCompletions):
            original = getattr(cls.create, _PATCHED, None)
            if original is not None:
                cls.create = original
