"""OTLP decoding benchmark: the CPU each side of the one OTLP layer (``schemas/otlp``) spends per span.

Two hot paths read OTLP: the collector (``collectors.records``: parse the request, check every span,
split it into one Kafka record per trace) and ingestion (``pipelines.bronze.decoding``: a Kafka record to
``spans`` rows through the lite view, token arrays decoded batch-wide). Each is timed in CPU seconds
(``time.process_time``, so a busy shared machine moves it less than wall time) over the same
requests, next to its floor measured in the same run: upb parsing those very bytes into messages,
which any decoder must at least do. The table shows medians of ``--runs``.

    .venv/bin/python benchmarks/bench_decode.py [--requests 200] [--runs 7]

Requests are agent-shaped: each holds two rollouts' traces, LLM calls with 512 prompt and 128 completion
token ids and logprobs, as the SDK and the gateway record them. The "tools" rows decode tool-call-heavy
LLM spans (10 messages of parallel tool calls and results in, 2 tool calls out, three tool definitions) in each
convention's layout (`pipelines.bronze.conventions`): the per-convention message readers' cost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from collectors.records import decode_traces, split_traces  # noqa: E402
from pipelines.bronze.decoding import KafkaRecord, decode_spans  # noqa: E402
from schemas.otlp.lite import ExportTraceServiceRequestLite  # noqa: E402
from tests.pipelines.otel import Call, Rollout, encode, make_spans  # noqa: E402


def agent_requests(n: int, seed: int = 0) -> list[bytes]:
    """``n`` OTLP/protobuf bodies, each two rollouts (4 calls and 1 call) with token ids and logprobs."""
    rng = random.Random(seed)
    t0 = 1_750_000_000 * 10**9
    out = []
    for i in range(n):
        calls = [
            Call(
                prompt=[rng.randrange(50_000) for _ in range(512)],
                response=[rng.randrange(50_000) for _ in range(128)],
                logprobs=[-rng.random() for _ in range(128)],
            )
            for _ in range(4)
        ]
        spans = make_spans(Rollout(f"r{i}", task_id="t", calls=calls, final_reward=1.0, t0_ns=t0))
        spans += make_spans(Rollout(f"s{i}", task_id="t", calls=calls[:1], t0_ns=t0))
        out.append(encode(spans))
    return out


def _history(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """10 chat messages (turns of 2 parallel tool calls and their results), the assistant's next tool
    calls, and 3 tools."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful calculator. " * 8}]
    for turn in range(3):
        msgs.append({"role": "user", "content": f"compute {rng.randrange(10**6)} * {rng.randrange(10**6)}"})
        calls = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": "mul", "arguments": json.dumps({"a": rng.randrange(999), "b": rng.random()})},
            }
            for i in range(2)
        ]
        msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
        msgs += [{"role": "tool", "tool_call_id": c["id"], "content": str(rng.randrange(10**9))} for c in calls]
    params = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
    tools = [
        {"type": "function", "function": {"name": n, "description": f"{n} a and b", "parameters": params}}
        for n in ("mul", "add", "sub")
    ]
    return msgs[:11], tools


def _gen_ai_parts(m: dict[str, Any]) -> dict[str, Any]:
    if m["role"] == "tool":
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": m["tool_call_id"], "response": m["content"]}],
        }
    parts: list[dict[str, Any]] = [{"type": "text", "content": m["content"]}] if m.get("content") else []
    for c in m.get("tool_calls") or ():
        f = c["function"]
        parts.append({"type": "tool_call", "id": c["id"], "name": f["name"], "arguments": json.loads(f["arguments"])})
    return {"role": m["role"], "parts": parts}


def _flat(prefix: str, msgs: list[dict[str, Any]], oi: bool) -> dict[str, Any]:
    """Messages flattened as OpenInference (``oi``) or pre-1.37 GenAI / OpenLLMetry write them."""
    out: dict[str, Any] = {}
    for i, m in enumerate(msgs):
        p = f"{prefix}{i}.message." if oi else f"{prefix}{i}."
        out[p + "role"] = m["role"]
        if m.get("content") is not None:
            out[p + "content"] = m["content"]
        if "tool_call_id" in m:
            out[p + "tool_call_id"] = m["tool_call_id"]
        for j, c in enumerate(m.get("tool_calls") or ()):
            f = c["function"]
            if oi:
                q = f"{p}tool_calls.{j}.tool_call."
                out |= {q + "id": c["id"], q + "function.name": f["name"], q + "function.arguments": f["arguments"]}
            else:
                q = f"{p}tool_calls.{j}."
                out |= {q + "id": c["id"], q + "name": f["name"], q + "arguments": f["arguments"]}
    return out


def tool_attributes(convention: str, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One LLM span's message and tool attributes in ``convention``'s layout."""
    history, reply = msgs[:-1], msgs[-1:]
    if convention == "gen_ai":
        return {
            "gen_ai.input.messages": json.dumps([_gen_ai_parts(m) for m in history]),
            "gen_ai.output.messages": json.dumps([_gen_ai_parts(m) for m in reply]),
            "gen_ai.tool.definitions": json.dumps([{"type": "function", **t["function"]} for t in tools]),
        }
    if convention == "openinference":
        return {
            "openinference.span.kind": "LLM",
            **_flat("llm.input_messages.", history, True),
            **_flat("llm.output_messages.", reply, True),
            **{f"llm.tools.{i}.tool.json_schema": json.dumps(t) for i, t in enumerate(tools)},
        }
    fns = {}
    for i, t in enumerate(tools):
        f = t["function"]
        q = f"llm.request.functions.{i}."
        fns |= {
            q + "name": f["name"],
            q + "description": f["description"],
            q + "parameters": json.dumps(f["parameters"]),
        }
    return {**_flat("gen_ai.prompt.", history, False), **_flat("gen_ai.completion.", reply, False), **fns}


TOOL_CONVENTIONS = ("gen_ai", "openinference", "gen_ai pre-1.37")


def tool_requests(n: int, convention: str, seed: int = 0) -> list[bytes]:
    """``n`` OTLP/protobuf bodies, each 4 tool-call-heavy LLM spans of one trace in ``convention``'s layout."""
    rng = random.Random(seed)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    out = []
    for i in range(n):
        exporter.clear()
        with tracer.start_as_current_span("agent", attributes={"agentlake.rollout.id": f"t{i}"}):
            for _ in range(4):
                msgs, tools = _history(rng)
                with tracer.start_as_current_span("chat", attributes=tool_attributes(convention, msgs, tools)):
                    pass
        out.append(encode(exporter.get_finished_spans()))
    return out


def cpu_seconds(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    bodies = agent_requests(args.requests)
    split = [
        split_traces(decode_traces(b, "protobuf"), tenant="default", topic="s", received_at_ns=1, strict=True)
        for b in bodies
    ]
    records = [
        KafkaRecord("s", 0, i, r.key, r.value, []) for i, r in enumerate(rec for s in split for rec in s.records)
    ]
    spans = sum(s.accepted_spans for s in split)

    def collector() -> None:
        for b in bodies:
            split_traces(decode_traces(b, "protobuf"), tenant="default", topic="s", received_at_ns=1, strict=True)

    def collector_floor() -> None:
        for b in bodies:
            ExportTraceServiceRequest.FromString(b)

    def pipeline() -> None:
        decode_spans(records)

    def pipeline_floor() -> None:
        for r in records:
            ExportTraceServiceRequestLite.FromString(r.value)

    paths: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "collector": (collector, collector_floor),
        "pipeline": (pipeline, pipeline_floor),
    }
    for convention in TOOL_CONVENTIONS:
        recs = [KafkaRecord("s", 0, i, None, b, []) for i, b in enumerate(tool_requests(args.requests, convention))]

        def tools_pipeline(recs: list[KafkaRecord] = recs) -> None:
            _, quarantined = decode_spans(recs)
            assert not quarantined, quarantined[0]["error"]

        def tools_floor(recs: list[KafkaRecord] = recs) -> None:
            for r in recs:
                ExportTraceServiceRequestLite.FromString(r.value)

        paths[f"tools {convention}"] = (tools_pipeline, tools_floor)
    times: dict[str, list[float]] = {k: [] for p in paths for k in (p, p + " floor")}
    for _ in range(args.runs):  # interleaved, so a burst of load hits both sides of a ratio
        for name, (fn, floor) in paths.items():
            times[name].append(cpu_seconds(fn))
            times[name + " floor"].append(cpu_seconds(floor))

    print(f"{args.requests} requests, {spans:,} spans, {len(records)} Kafka records; median of {args.runs} runs")
    print(f"{'path':<26} {'spans/s (CPU)':>14} {'floor spans/s':>14} {'ratio':>6} {'min..max spans/s':>22}")
    for name in paths:
        n = spans if not name.startswith("tools") else 5 * args.requests  # 4 LLM spans + the agent span
        med, floor = statistics.median(times[name]), statistics.median(times[name + " floor"])
        lo, hi = n / max(times[name]), n / min(times[name])
        print(f"{name:<26} {n / med:>14,.0f} {n / floor:>14,.0f} {floor / med:>6.2f} {lo:>10,.0f}..{hi:<10,.0f}")
    print("floor: upb parsing the same bytes (the collector: full messages; ingestion: the lite view)")
    print("tools <convention>: ingestion of tool-call-heavy LLM spans in that convention's layout")


if __name__ == "__main__":
    main()
