"""OTLP decoding benchmark: the CPU each side of the one OTLP layer (``schemas/otlp``) spends per span.

Two hot paths read OTLP: the collector (``collectors.records``: parse the request, check every span,
split it into one Kafka record per trace) and ingestion (``pipelines.bronze.decoding``: a Kafka record to
``spans`` rows through the lite view, token arrays decoded batch-wide). Each is timed in CPU seconds
(``time.process_time``, so a busy shared machine moves it less than wall time) over the same
requests, next to its floor measured in the same run: upb parsing those very bytes into messages,
which any decoder must at least do. The table shows medians of ``--runs``.

    .venv/bin/python benchmarks/bench_decode.py [--requests 200] [--runs 7]

Requests are agent-shaped: each holds two rollouts' traces, LLM calls with 512 prompt and 128 completion
token ids and logprobs, as the SDK and the gateway record them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

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

    paths = {"collector": (collector, collector_floor), "pipeline": (pipeline, pipeline_floor)}
    times: dict[str, list[float]] = {k: [] for p in paths for k in (p, p + " floor")}
    for _ in range(args.runs):  # interleaved, so a burst of load hits both sides of a ratio
        for name, (fn, floor) in paths.items():
            times[name].append(cpu_seconds(fn))
            times[name + " floor"].append(cpu_seconds(floor))

    print(f"{args.requests} requests, {spans:,} spans, {len(records)} Kafka records; median of {args.runs} runs")
    print(f"{'path':<10} {'spans/s (CPU)':>14} {'floor spans/s':>14} {'ratio':>6} {'min..max spans/s':>22}")
    for name in paths:
        med, floor = statistics.median(times[name]), statistics.median(times[name + " floor"])
        lo, hi = spans / max(times[name]), spans / min(times[name])
        print(
            f"{name:<10} {spans / med:>14,.0f} {spans / floor:>14,.0f} {floor / med:>6.2f} {lo:>10,.0f}..{hi:<10,.0f}"
        )
    print("floor: upb parsing the same bytes (the collector: full messages; ingestion: the lite view)")


if __name__ == "__main__":
    main()
