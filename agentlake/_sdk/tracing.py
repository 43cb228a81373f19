"""``init``, ``rollout``, ``emit_reward`` and ``@reward``: OTel tracing that the collector understands.

``init`` installs an OTel tracer provider exporting OTLP to the collector. ``rollout`` opens an
``agentlake.rollout`` span and stamps every span started inside it (ours, or any library's
instrumentation) with the rollout, attempt, task and agent ids, so the pipeline can group them.
A reward inside a rollout is an ``agentlake.reward`` span; a reward for a finished rollout is a
late event POSTed to the collector's ``/v1/rewards``.

``headers`` names the current rollout and agent to the gateway (``collectors.gateway.proxy``): the
rollout, attempt and task ids, the agent (``x-agentlake-agent``, which picks the agent's policy line,
``trainer.agents``) and ``traceparent``. The instrumented OpenAI client sends them by itself; an agent
that talks raw HTTP adds ``agentlake.headers()`` to its requests.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from schemas import attributes as A
from schemas.errors import AgentlakeError

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
TRACER_NAME = "agentlake"
F = TypeVar("F", bound=Callable[..., Any])
# The gateway's request headers (collectors.gateway.proxy, which a test holds these to), spelled here
# so that importing the SDK imports no server.
ROLLOUT_HEADER = "x-agentlake-rollout-id"
ATTEMPT_HEADER = "x-agentlake-attempt-id"
TASK_HEADER = "x-agentlake-task-id"
AGENT_HEADER = "x-agentlake-agent"


class SdkError(AgentlakeError):
    """The SDK was used out of order, or the collector refused what it sent."""


@dataclass
class _State:
    provider: TracerProvider | None = None
    endpoint: str = DEFAULT_ENDPOINT
    headers: dict[str, str] = field(default_factory=dict)
    agent_name: str | None = None


state = _State()


@dataclass
class Rollout:
    """The rollout a ``with agentlake.rollout(...)`` block runs; ``rollout_id`` is known on entry."""

    task_id: str | None = None
    rollout_id: str | None = None
    attempt: str | None = None
    agent_name: str | None = None
    status: str = "running"
    span: trace.Span | None = None
    _token: contextvars.Token[Rollout | None] | None = None
    _otel_token: object = None

    def stamp(self) -> dict[str, str]:
        """The attributes every span inside this rollout carries."""
        out = {A.ROLLOUT_ID: self.rollout_id or ""}
        for key, value in ((A.ATTEMPT_ID, self.attempt), (A.TASK_ID, self.task_id), (A.AGENT_NAME, self.agent_name)):
            if value:
                out[key] = value
        return out

    def emit_reward(self, value: float, name: str = A.PRIMARY_REWARD_NAME) -> None:
        """A reward for this rollout (same as ``agentlake.emit_reward`` inside the block)."""
        _reward_span(self, value, name)

    def __enter__(self) -> Rollout:
        tracer = tracer_provider().get_tracer(TRACER_NAME)
        self.span = tracer.start_span(A.ROLLOUT_SPAN_NAME)
        ctx = self.span.get_span_context()
        if not self.rollout_id:
            self.rollout_id = format(ctx.trace_id, "032x")  # the design's default: trace id = rollout id
        self.agent_name = self.agent_name or state.agent_name
        for k, v in self.stamp().items():
            self.span.set_attribute(k, v)
        self._otel_token = otel_context.attach(trace.set_span_in_context(self.span))
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        assert self.span is not None and self._token is not None
        self.status = "failed" if exc is not None else "finished"
        self.span.set_attribute(A.ROLLOUT_STATUS, self.status)
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
        self.span.end()
        _current.reset(self._token)
        otel_context.detach(self._otel_token)  # type: ignore[arg-type]

    async def __aenter__(self) -> Rollout:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.__exit__(exc_type, exc, tb)


_current: contextvars.ContextVar[Rollout | None] = contextvars.ContextVar("agentlake_rollout", default=None)


class RolloutStamper(SpanProcessor):
    """Puts the current rollout's ids on every span that starts inside it."""

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        current = _current.get()
        if current is not None:
            for k, v in current.stamp().items():
                if span.attributes is None or k not in span.attributes:
                    span.set_attribute(k, v)

    def on_end(self, span: ReadableSpan) -> None:
        return None


def tracer_provider() -> TracerProvider:
    """The provider ``init`` installed; ``SdkError`` if ``init`` was not called."""
    if state.provider is None:
        raise SdkError("call agentlake.init(...) before starting rollouts or emitting rewards")
    return state.provider


def flush(timeout_s: float = 30.0) -> bool:
    """Export every finished span now (call before a short script exits)."""
    return tracer_provider().force_flush(int(timeout_s * 1000))


def rollout(
    task_id: str | None = None,
    *,
    rollout_id: str | None = None,
    attempt: str | int | None = None,
    agent_name: str | None = None,
) -> Rollout:
    """``with agentlake.rollout(task_id=...) as r:`` stamps every span inside with the rollout's ids."""
    return Rollout(
        task_id=task_id, rollout_id=rollout_id, attempt=None if attempt is None else str(attempt), agent_name=agent_name
    )


def current_rollout() -> Rollout | None:
    """The innermost active rollout of this task or thread, if any."""
    return _current.get()


def _header_value(value: str) -> bool:
    """Whether ``value`` can travel as an HTTP header value as it is (printable ASCII, so no line breaks)."""
    return value != "" and value.isascii() and value.isprintable()


def rollout_headers() -> dict[str, str]:
    """The gateway headers that name the current rollout (rollout, attempt, task ids) and the agent.

    The agent is the current rollout's ``agent_name`` (which defaults to ``init``'s), outside a
    rollout ``init``'s; with neither, no agent header. A value that cannot be a header value
    (not printable ASCII) is left out: the spans still carry it.
    """
    current = _current.get()
    named = {AGENT_HEADER: state.agent_name}
    if current is not None:
        named = {
            ROLLOUT_HEADER: current.rollout_id,
            ATTEMPT_HEADER: current.attempt,
            TASK_HEADER: current.task_id,
            AGENT_HEADER: current.agent_name,
        }
    return {key: value for key, value in named.items() if value is not None and _header_value(value)}


def headers() -> dict[str, str]:
    """Headers for an agent's own HTTP call to the gateway: ``rollout_headers`` plus the current ``traceparent``.

    ``httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=agentlake.headers())`` inside
    ``agentlake.rollout`` files the gateway's span under the rollout and serves the call from the
    agent's policy line. The instrumented OpenAI client needs none of this: it sends them itself.
    """
    out = rollout_headers()
    inject(out)
    return out


def _reward_span(r: Rollout | None, value: float, name: str) -> None:
    tracer = tracer_provider().get_tracer(TRACER_NAME)
    attrs: dict[str, Any] = {A.REWARD_VALUE: float(value), A.REWARD_NAME: name}
    ctx = trace.set_span_in_context(r.span) if r is not None and r.span is not None else None
    with tracer.start_as_current_span(A.REWARD_SPAN_NAME, context=ctx, attributes=attrs):
        pass


def emit_reward(
    value: float,
    name: str = A.PRIMARY_REWARD_NAME,
    *,
    rollout_id: str | None = None,
    trace_id: str | None = None,
    response_id: str | None = None,
    event_id: str | None = None,
    timeout_s: float = 10.0,
) -> None:
    """Record a reward: a reward span inside the current rollout, or a late event naming the rollout.

    Inside ``agentlake.rollout`` with no ids given, the reward joins that rollout's trace. With
    ``rollout_id`` / ``trace_id`` / ``response_id`` it is POSTed to the collector's /v1/rewards
    (it may arrive days later; the pipeline re-scores the trajectory).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SdkError(f"a reward is a number, got {type(value).__name__}")
    if rollout_id is None and trace_id is None and response_id is None:
        current = _current.get()
        if current is None:
            raise SdkError("emit_reward outside agentlake.rollout(...) must name rollout_id, trace_id or response_id")
        _reward_span(current, value, name)
        return
    import httpx

    event = {
        "value": float(value),
        "name": name,
        "rollout_id": rollout_id,
        "trace_id": trace_id,
        "response_id": response_id,
        "event_id": event_id,
        "timestamp": time.time_ns(),
    }
    event = {k: v for k, v in event.items() if v is not None}
    url = state.endpoint if state.provider is not None else (os.environ.get("AGENTLAKE_ENDPOINT") or DEFAULT_ENDPOINT)
    try:
        r = httpx.post(f"{url.rstrip('/')}/v1/rewards", json=event, headers=state.headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise SdkError(f"could not send the reward to {url}: {exc}") from exc
    if r.status_code != 200:
        raise SdkError(f"the collector refused the reward ({r.status_code}): {r.text[:300]}")


@overload
def reward(fn: F) -> F: ...
@overload
def reward(*, name: str = A.PRIMARY_REWARD_NAME) -> Callable[[F], F]: ...


def reward(fn: F | None = None, *, name: str = A.PRIMARY_REWARD_NAME) -> F | Callable[[F], F]:
    """Decorate a reward function: whatever number it returns is emitted as a reward, then returned.

    ``@agentlake.reward`` or ``@agentlake.reward(name="format")``; sync or async functions.
    """

    def wrap(f: F) -> F:
        def check(result: Any) -> Any:
            if isinstance(result, bool) or not isinstance(result, int | float):
                raise SdkError(f"reward function {f.__name__} returned {type(result).__name__}, not a number")
            emit_reward(float(result), name)
            return result

        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                return check(await f(*args, **kwargs))

            return awrapper  # type: ignore[return-value]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return check(f(*args, **kwargs))

        return wrapper  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap
