"""Collector throughput and latency: OTLP/HTTP and OTLP/gRPC into a real broker, vs raw produce.

    .venv/bin/python benchmarks/bench_collectors.py [--seconds 3] [--batches 1,64,512] [--runs 3]
        [--brokers memory,durable] [--gateway URL]

For each broker (``memory``: Tansu with its log in memory; ``durable``: Tansu on the local SeaweedFS,
the default of `agentlake up`) starts the broker and ``python -m collectors`` as a subprocess
(acks=all, idempotent producer), then for each batch size sends OTLP requests of small spans (traces of 8 spans) from
``--clients`` threads for ``--seconds`` and reports acknowledged spans/s and request latency
p50/p99. The ceiling (``raw``) is the collector's own producer, confluent-kafka with the sink's very
config (acks=all, idempotent), producing the very same records in this process; the ratio column is
collector / ceiling. ``kafka-python`` is the same records through kafka-python (acks=all, idempotent),
the client the collector used before: it shows why it moved. ``--gateway`` (a vLLM URL) also measures the
gateway's added latency over calling vLLM directly.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
from confluent_kafka import KafkaError, Message, Producer
from kafka import KafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentlake.stack.broker import DurableBroker, LocalBroker, ensure_topics, free_port  # noqa: E402
from collectors.kafka_sink import KafkaSink  # noqa: E402
from collectors.records import Record, split_traces  # noqa: E402
from schemas.config import KafkaSettings  # noqa: E402

SPANS_PER_TRACE = 8


def make_body(batch: int, seq: int) -> bytes:
    """``batch`` small spans (4 attributes) in traces of up to 8 spans, one resource and scope."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value={"string_value": "bench-agent"})
    ss = rs.scope_spans.add()
    ss.scope.name = "bench"
    for i in range(batch):
        t = (seq * 100_000 + i // SPANS_PER_TRACE).to_bytes(16, "big")
        s = ss.spans.add(
            trace_id=t,
            span_id=(seq * 10_000 + i + 1).to_bytes(8, "big"),
            name="llm.step",
            start_time_unix_nano=1_700_000_000_000_000_000 + i,
            end_time_unix_nano=1_700_000_001_000_000_000,
        )
        s.attributes.add(key="agentlake.rollout.id", value={"string_value": f"rollout-{seq}-{i // SPANS_PER_TRACE}"})
        s.attributes.add(key="gen_ai.operation.name", value={"string_value": "chat"})
        s.attributes.add(key="gen_ai.usage.input_tokens", value={"int_value": 120})
        s.attributes.add(key="step", value={"int_value": i})
    return req.SerializeToString()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def drive(send, bodies: list[bytes], batch: int, seconds: float, clients: int) -> tuple[float, list[float], int]:
    """Run ``clients`` threads calling ``send(body)`` for ``seconds``; (spans/s, latencies ms, errors).

    Each body is sent once: the collector answers a repeated body from its idempotency cache
    without producing, which would inflate the numbers.
    """
    latencies: list[float] = []
    order = itertools.count()
    errors = [0]
    count = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        local, n, errs = [], 0, 0
        while time.monotonic() < stop:
            i = next(order)
            if i >= len(bodies):
                break
            t0 = time.perf_counter()
            ok = send(bodies[i])
            local.append((time.perf_counter() - t0) * 1000)
            n += batch if ok else 0
            errs += 0 if ok else 1
        with lock:
            latencies.extend(local)
            count[0] += n
            errors[0] += errs

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count[0] / (time.monotonic() - start), latencies, errors[0]


def records_of(topic: str, bodies: list[bytes]) -> list[list[Record]]:
    """The records the collector writes for each body."""
    return [
        split_traces(
            ExportTraceServiceRequest.FromString(b),
            tenant="default",
            topic=topic,
            received_at_ns=time.time_ns(),
            original=b,
        ).records
        for b in bodies
    ]


def produce_for(
    send: Callable[[Record], object],
    flush: Callable[[], object],
    splits: list[list[Record]],
    batch: int,
    seconds: float,
) -> float:
    """Send the records of ``splits`` in turn for ``seconds`` (a flush every 50 requests); spans/s acknowledged."""
    spans = 0
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        for r in splits[i % len(splits)]:
            send(r)
        spans += batch
        i += 1
        if i % 50 == 0:
            flush()
    flush()
    return spans / (time.monotonic() - start)


def raw_ceiling(kafka: KafkaSettings, splits: list[list[Record]], batch: int, seconds: float) -> float:
    """The collector's producer (confluent-kafka, the sink's config) producing ``splits`` as fast as it can."""
    failed: list[KafkaError] = []

    def report(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed.append(err)

    producer = Producer({**KafkaSink(kafka).producer_config, "on_delivery": report})
    rate = produce_for(
        lambda r: producer.produce(r.topic, r.value, r.key, headers=r.headers), producer.flush, splits, batch, seconds
    )
    producer.close()
    if failed:
        raise SystemExit(f"raw produce: {len(failed)} record(s) not acknowledged, e.g. {failed[0]}")
    return rate


def kafka_python_ceiling(bootstrap: str, splits: list[list[Record]], batch: int, seconds: float) -> float:
    """The same records through kafka-python (acks=all, idempotent): the collector's client before."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=2,
        batch_size=1 << 20,
        max_request_size=17 << 20,
    )
    rate = produce_for(
        lambda r: producer.send(r.topic, value=r.value, key=r.key, headers=r.headers),
        producer.flush,
        splits,
        batch,
        seconds,
    )
    producer.close()
    return rate


def gateway_overhead(vllm_url: str, gateway_url: str, n: int = 30) -> tuple[float, float]:
    body = {
        "model": httpx.get(f"{vllm_url}/v1/models").json()["data"][0]["id"],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    with httpx.Client(timeout=120) as c:

        def p50(url: str) -> float:
            lat = []
            for _ in range(n):
                t0 = time.perf_counter()
                c.post(f"{url}/v1/chat/completions", json=body).raise_for_status()
                lat.append((time.perf_counter() - t0) * 1000)
            return statistics.median(lat)

        p50(vllm_url)
        return p50(vllm_url), p50(gateway_url)


def start_broker(kind: str, workdir: Path) -> LocalBroker | DurableBroker:
    """The memory broker (Tansu, log in memory) or the durable one (Tansu on the local SeaweedFS)."""
    if kind == "memory":
        return LocalBroker().start()
    return DurableBroker(workdir).start()


def wait_healthy(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not become healthy")
        time.sleep(0.2)


def measure(kind: str, args: argparse.Namespace, workdir: Path, seq: itertools.count) -> list[dict[str, object]]:
    """One broker of ``kind``, a collector on it, every (batch, protocol) cell with its raw ceiling."""
    batches = [int(b) for b in args.batches.split(",")]
    broker = start_broker(kind, workdir / kind)
    kafka = KafkaSettings(
        bootstrap_servers=broker.bootstrap,
        spans_topic="bench.spans",
        rewards_topic="bench.rewards",
        models_topic="bench.models",
        partitions=4,
    )
    ensure_topics(kafka, broker.bootstrap)
    http_port, grpc_port, gw_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "AGENTLAKE_KAFKA__SPANS_TOPIC": kafka.spans_topic,
        "AGENTLAKE_KAFKA__REWARDS_TOPIC": kafka.rewards_topic,
        "AGENTLAKE_COLLECTOR__HTTP_PORT": str(http_port),
        "AGENTLAKE_COLLECTOR__GRPC_PORT": str(grpc_port),
        "AGENTLAKE_GATEWAY__PORT": str(gw_port),
    }
    if args.gateway:
        env["AGENTLAKE_GATEWAY__UPSTREAMS"] = f'["{args.gateway}"]'
    procs = [subprocess.Popen([sys.executable, "-m", "collectors"], env=env, stderr=subprocess.DEVNULL)]
    if args.gateway:
        procs.append(subprocess.Popen([sys.executable, "-m", "collectors.gateway"], env=env, stderr=subprocess.DEVNULL))
    rows: list[dict[str, object]] = []
    try:
        wait_healthy(f"http://127.0.0.1:{http_port}/health")
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{http_port}", timeout=30, limits=httpx.Limits(max_connections=args.clients * 2)
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")

        def send_http(body: bytes) -> bool:
            return (
                http.post("/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}).status_code
                == 200
            )

        def send_grpc(body: bytes) -> bool:
            try:
                export(body, timeout=30)
                return True
            except grpc.RpcError:
                return False

        for batch in batches:
            pool = int(args.max_rate * args.seconds / batch) + 20
            splits = records_of(kafka.spans_topic, [make_body(batch, next(seq)) for _ in range(64)])
            raw = raw_ceiling(kafka, splits, batch, args.seconds)
            kp = kafka_python_ceiling(broker.bootstrap, splits, batch, args.seconds)
            for name, send in (("http", send_http), ("grpc", send_grpc)):
                bodies = [make_body(batch, next(seq)) for _ in range(pool)]
                send(bodies.pop())
                rate, lat, errors = drive(send, bodies, batch, args.seconds, args.clients)
                rows.append(
                    dict(
                        broker=kind,
                        protocol=name,
                        batch=batch,
                        rate=rate,
                        p50=percentile(lat, 0.5),
                        p99=percentile(lat, 0.99),
                        errors=errors,
                        raw=raw,
                        kafka_python=kp,
                    )
                )
        if args.gateway:
            direct, through = gateway_overhead(args.gateway, f"http://127.0.0.1:{gw_port}")
            print(
                f"gateway ({kind} broker): vLLM direct p50 {direct:.1f} ms, through gateway p50 {through:.1f} ms, "
                f"overhead {through - direct:.1f} ms"
            )
        channel.close()
        http.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        broker.stop()
    return rows


def median_rows(runs: list[list[dict[str, object]]]) -> list[dict[str, object]]:
    """Per cell, the median of each figure over the runs (errors summed)."""
    out = []
    for cells in zip(*runs, strict=True):
        first = cells[0]
        row = dict(first)
        for key in ("rate", "p50", "p99", "raw", "kafka_python"):
            row[key] = statistics.median(float(c[key]) for c in cells)  # type: ignore[arg-type]
        row["ratio"] = statistics.median(float(c["rate"]) / float(c["raw"]) for c in cells)  # type: ignore[arg-type]
        row["errors"] = sum(int(c["errors"]) for c in cells)  # type: ignore[call-overload]
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batches", default="1,64,512")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--brokers", default="memory,durable", help="which local brokers to measure, in this run")
    ap.add_argument("--runs", type=int, default=1, help="runs per broker; the table shows medians")
    ap.add_argument("--max-rate", type=int, default=60_000, help="spans/s to prepare distinct bodies for")
    ap.add_argument("--gateway", metavar="VLLM_URL", help="also measure gateway overhead against this vLLM")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.brokers.split(",") if k.strip()]
    for k in kinds:
        if k not in ("memory", "durable"):
            raise SystemExit(f"--brokers: unknown broker {k!r}; use memory and/or durable")
    seq = itertools.count()
    print(
        f"{args.clients} client threads, {args.seconds:.0f}s per cell, traces of {SPANS_PER_TRACE} spans, "
        f"{args.runs} run(s) per broker (medians); raw = the collector's producer (confluent-kafka, same config, "
        "acks=all) producing the same records into the same broker in the same run; kafka-python = the same through "
        "kafka-python, the collector's client before"
    )
    with tempfile.TemporaryDirectory(prefix="bench-collectors-") as tmp:
        table: list[dict[str, object]] = []
        for kind in kinds:
            runs = [measure(kind, args, Path(tmp) / f"run{r}", seq) for r in range(args.runs)]
            table.extend(median_rows(runs))
    print(
        f"{'broker':8} {'protocol':8} {'batch':>5} {'spans/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
        f"{'raw spans/s':>12} {'ratio':>6} {'kafka-python':>12}"
    )
    for r in table:
        print(
            f"{r['broker']:8} {r['protocol']:8} {r['batch']:>5} {r['rate']:>10,.0f} {r['p50']:>8.2f} "
            f"{r['p99']:>8.2f} {r['errors']:>6} {r['raw']:>12,.0f} {r['ratio']:>6.2f} {r['kafka_python']:>12,.0f}"
        )


if __name__ == "__main__":
    main()
