"""The process's global OTel tracer provider: one that follows the provider ``agentlake.init`` installed last.

OpenTelemetry sets the global provider once per process and ignores later calls. Had ``init`` handed
it its own provider, a second ``init`` (a test session, a notebook re-run, a worker that re-reads its
settings) would leave every tracer taken from the global provider (library instrumentation, modules
that call ``trace.get_tracer`` at import) writing to the first provider, which ``init`` has shut down:
their spans would be lost without a word. So the global provider is this delegating one, installed
once; each span goes to whichever provider is current when it starts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)


class _Target:
    provider: TracerProvider | None = None  # the provider the last ``init(set_global=True)`` made


_target = _Target()


class CurrentTracer(trace.Tracer):
    """A tracer that starts each span on the current target provider (a no-op tracer before ``init``)."""

    def __init__(self, name: str, version: str | None, schema_url: str | None, attributes: Any) -> None:
        self._args = (name, version, schema_url, attributes)
        self._for: TracerProvider | None = None
        self._tracer: trace.Tracer = trace.NoOpTracer()

    def _current(self) -> trace.Tracer:
        provider = _target.provider
        if provider is None:
            return trace.NoOpTracer()
        if provider is not self._for:
            self._for, self._tracer = provider, provider.get_tracer(*self._args)
        return self._tracer

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> trace.Span:
        return self._current().start_span(name, *args, **kwargs)

    # OTel types the base method with its private _AgnosticContextManager, a subclass of contextlib's
    @contextmanager
    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Iterator[trace.Span]:  # type: ignore[override]
        with self._current().start_as_current_span(name, *args, **kwargs) as span:
            yield span


class FollowingTracerProvider(trace.TracerProvider):
    """The global provider agentlake installs: its tracers follow ``init``'s latest provider."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Mapping[str, Any] | Sequence[Any] | None = None,
    ) -> trace.Tracer:
        return CurrentTracer(instrumenting_module_name, instrumenting_library_version, schema_url, attributes)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the current provider (what a caller of the global one expects)."""
        return _target.provider.force_flush(timeout_millis) if _target.provider is not None else True


def install_global(provider: TracerProvider) -> None:
    """Make ``provider`` the one the global tracers write to, installing the following provider once."""
    _target.provider = provider
    current = trace.get_tracer_provider()
    if isinstance(current, FollowingTracerProvider):
        return
    if not isinstance(current, trace.ProxyTracerProvider):
        log.warning(
            "another OpenTelemetry tracer provider (%s) is already the global one, so spans from tracers "
            "taken from it do not reach agentlake; pass set_global=False and use the provider init returns",
            type(current).__name__,
        )
        return
    trace.set_tracer_provider(FollowingTracerProvider())
