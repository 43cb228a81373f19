"""The peer, side by side: Agent Lightning 0.3.0's own adapter on the benchmark's rollouts.

Runs in the benchmark's own venv (``benchmarks/.venv-peer``, never the product's: Agent Lightning
pins its own OpenTelemetry, LiteLLM and FastAPI), made by ``ensure_venv`` below or by hand:

    python3 -m venv benchmarks/.venv-peer
    benchmarks/.venv-peer/bin/pip install agentlightning==0.3.0

``bench_pipelines.py --peer`` writes the rollouts its timed increment ingested (the same ids,
token ids, calls and rewards) as JSON lines and runs this file with that venv's Python. Here each
rollout becomes spans the way Agent Lightning records them (ids in the resource, LLM calls named
``openai.chat.completion`` with ``prompt_token_ids``/``response_token_ids``, the reward as an
``agentlightning.annotation`` span with ``agentlightning.reward.0.*``), through the real OTel SDK and
encoded as OTLP protobuf, untimed. Timed: the store's OTLP receiver decoding each rollout's request
(``agentlightning.utils.otlp.spans_from_proto``), and ``TracerTraceToTriplet().adapt`` turning the
spans into triplets. It prints one JSON object: seconds of each and rollouts/s.

This file imports nothing of agentlake: the peer venv does not hold it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

PEER_VERSION = "0.3.0"
VENV = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venv-peer")


def venv_python(venv: str = VENV) -> str:
    return os.path.join(venv, "bin", "python")


def ensure_venv(venv: str = VENV) -> str:
    """Make the peer's venv if it is missing (python -m venv + pip install agentlightning==0.3.0)."""
    py = venv_python(venv)
    if not os.path.exists(py):
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", venv], check=True)
    probe = [py, "-c", "import importlib.metadata as m; print(m.version('agentlightning'))"]
    have = subprocess.run(probe, capture_output=True, text=True)
    if have.returncode != 0 or have.stdout.strip() != PEER_VERSION:
        subprocess.run([py, "-m", "pip", "install", "-q", f"agentlightning=={PEER_VERSION}"], check=True)
    return py


def run_peer(rollouts_jsonl: str, venv: str = VENV) -> dict[str, Any]:
    """Run this file's ``main`` in the peer venv on the rollouts written to ``rollouts_jsonl``."""
    py = ensure_venv(venv)
    out = subprocess.run([py, os.path.abspath(__file__), rollouts_jsonl], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"peer failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _encode(rollout: dict[str, Any]) -> bytes:
    """One rollout's spans as Agent Lightning's tracer records them, as one OTLP request."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import set_span_in_context

    ms = 1_000_000
    exporter = InMemorySpanExporter()
    resource = Resource.create(
        {
            "service.name": "bench-agent",
            "agentlightning.rollout_id": rollout["rollout_id"],
            "agentlightning.attempt_id": rollout["rollout_id"] + "-a0",
        }
    )
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("agentlightning")
    t = 1_750_000_000_000 * ms
    root = tracer.start_span("agent.run", start_time=t, attributes={"agent.name": "solver"})
    ctx = set_span_in_context(root)
    for i, call in enumerate(rollout["calls"]):
        t += 10 * ms
        attrs = {
            "prompt_token_ids": call["prompt"],
            "response_token_ids": call["response"],
            "gen_ai.response.id": f"resp-{rollout['rollout_id']}-{i}",
            "gen_ai.request.temperature": 0.8,
        }
        s = tracer.start_span("openai.chat.completion", context=ctx, start_time=t, attributes=attrs)
        t += 5 * ms
        s.end(end_time=t)
        tool = tracer.start_span("tool.calc", context=ctx, start_time=t + ms, attributes={"tool.name": "calc"})
        tool.end(end_time=t + 2 * ms)
    t += 10 * ms
    reward = {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": rollout["final_reward"]}
    r = tracer.start_span("agentlightning.annotation", context=ctx, start_time=t, attributes=reward)
    r.end(end_time=t + ms)
    root.end(end_time=t + 5 * ms)
    tp.shutdown()
    return bytes(encode_spans(exporter.get_finished_spans()).SerializeToString())


def main(path: str) -> dict[str, Any]:
    import asyncio
    import importlib.metadata
    import logging

    from agentlightning.adapter.triplet import TracerTraceToTriplet
    from agentlightning.utils.otlp import spans_from_proto
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    logging.disable(logging.WARNING)
    with open(path) as f:
        rollouts = [json.loads(line) for line in f]
    t0 = time.perf_counter()
    requests = [_encode(r) for r in rollouts]
    encode_s = time.perf_counter() - t0

    async def seq_ids(keys: Any) -> list[int]:  # the store's sequence numbers; a counter here
        return list(range(len(keys)))

    adapter = TracerTraceToTriplet()

    async def decode_all() -> list[Any]:
        return [await spans_from_proto(ExportTraceServiceRequest.FromString(b), seq_ids) for b in requests]

    t0 = time.perf_counter()
    spans = asyncio.run(decode_all())
    decode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    trajectories = [adapter.adapt(s) for s in spans]
    adapt_s = time.perf_counter() - t0
    triplets = sum(len(t) for t in trajectories)
    calls = sum(len(r["calls"]) for r in rollouts)
    rewards_ok = sum(1 for r, t in zip(rollouts, trajectories, strict=True) if t and t[-1].reward == r["final_reward"])
    # untimed: the triplets hold the very token ids each call was given, so the adapter did the whole work
    tokens_ok = sum(
        1
        for r, t in zip(rollouts, trajectories, strict=True)
        for c, x in zip(r["calls"], t, strict=False)
        if x.prompt.get("token_ids") == c["prompt"] and x.response.get("token_ids") == c["response"]
    )
    return {
        "version": importlib.metadata.version("agentlightning"),
        "rollouts": len(rollouts),
        "spans": sum(len(s) for s in spans),
        "triplets": triplets,
        "calls": calls,
        "rewards_matched": rewards_ok,
        "tokens_matched": tokens_ok,
        "encode_s_untimed": encode_s,
        "decode_s": decode_s,
        "adapt_s": adapt_s,
        "adapt_rollouts_s": len(rollouts) / adapt_s,
        "decode_adapt_rollouts_s": len(rollouts) / (decode_s + adapt_s),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
