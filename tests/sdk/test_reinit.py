"""A second ``agentlake.init`` in one process: tracers from the global provider follow it.

Run in a child process: OpenTelemetry's global provider can be set once per process, which is the
very behaviour under test, so the test session's own global provider stays untouched.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import agentlake

library = trace.get_tracer("some.library")  # taken at import time, before any init
first, second = InMemorySpanExporter(), InMemorySpanExporter()
agentlake.init(exporter=first, batch=False, instrument_openai=False)
with agentlake.rollout(task_id="t1"):
    with library.start_as_current_span("tool.one"):
        pass
agentlake.init(exporter=second, batch=False, instrument_openai=False)
late = trace.get_tracer("late.library")
with agentlake.rollout(task_id="t2"):
    library.start_span("tool.two").end()
    with late.start_as_current_span("tool.three"):
        pass
print(json.dumps({
    "first": sorted(s.name for s in first.get_finished_spans()),
    "second": sorted(s.name for s in second.get_finished_spans()),
    "tasks": sorted({s.attributes.get("agentlake.task.id") for s in second.get_finished_spans()}),
    "flushed": trace.get_tracer_provider().force_flush(1000),
}))
"""


def test_a_second_init_receives_the_global_tracers_spans() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got["first"] == ["agentlake.rollout", "tool.one"]
    assert got["second"] == ["agentlake.rollout", "tool.three", "tool.two"]  # not lost on the shut-down first
    assert got["tasks"] == ["t2"]  # stamped by the second rollout
    assert got["flushed"] is True
    assert "Overriding of current TracerProvider" not in out.stderr
