"""The gateway's disk spill: calls recorded while Kafka is away reach Kafka once it is back, once each.

Issue 14, finding 8: the gateway gave up on a call's span after 60 s without Kafka, although the
client had its 200. Here the gateway points at a port where no broker runs yet, takes calls, is
restarted, takes more, and then a real broker (Tansu, the same as the ``kafka_settings`` fixture
starts) comes up on that port. The upstream is the in-process vLLM-shaped fake of
test_gateway.py; Kafka, the spill folder and the gateway's HTTP server are real.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentlake.stack.broker import LocalBroker, ensure_topics
from agentlake.stack.health import gateway_spill
from agentlake.stack.ports import free_port
from collectors.gateway.serve import GatewayServer, spill_dir
from collectors.gateway.spill import SpillSink
from collectors.records import Record
from collectors.sink import MemorySink
from schemas import attributes as A
from schemas.config import KafkaSettings, Settings, load_settings
from tests.collectors.helpers import LoopThread, read_topic, wait_until
from tests.collectors.test_gateway import UPSTREAM, FakeVllm

pytestmark = pytest.mark.kafka


def settings_for(tmp_path: Path, port: int, **gateway: object) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    kafka = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        spans_topic=f"test.spans.{suffix}",
        rewards_topic=f"test.rewards.{suffix}",
        models_topic=f"test.models.{suffix}",
        partitions=1,  # one partition: the order of the whole topic is the order of the calls
    )
    return load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "kafka": kafka.model_dump(),
            "gateway": {"port": 0, "upstreams": [UPSTREAM], **gateway},
        },
    )


@contextmanager
def running_gateway(settings: Settings) -> Iterator[tuple[str, GatewayServer]]:
    lt = LoopThread()
    server = GatewayServer(settings, client=httpx.AsyncClient(transport=httpx.ASGITransport(FakeVllm().app())))
    lt.run(server.start())
    try:
        yield f"http://127.0.0.1:{server.port}", server
    finally:
        lt.run(server.stop(), timeout=120)
        lt.close()


def call(base: str, text: str) -> None:
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        headers={"x-agentlake-rollout-id": "spilled"},
        timeout=30,
    )
    assert r.status_code == 200, r.text  # the client has its answer whatever Kafka does


def spill_of(base: str) -> dict[str, object]:
    return httpx.get(f"{base}/health", timeout=5).json()["spill"]


@pytest.mark.slow  # a broker down, then started, behind a restarted gateway: ~7 s
def test_calls_wait_on_disk_across_a_restart_and_reach_kafka_once_in_order(tmp_path: Path) -> None:
    port = free_port()
    settings = settings_for(tmp_path, port)
    folder = spill_dir(settings)

    with running_gateway(settings) as (base, server):
        for i in range(3):
            call(base, f"call {i}")
        wait_until(lambda: server.gateway.recorder.recorded_spans == 3, 10, "calls in the spill")
        spill = spill_of(base)
        assert spill["records"] == 3 and spill["dropped"] == 0 and spill["last_error"]
        assert gateway_spill(f"{base}/health", timeout_s=5).startswith("spill: 3 calls")  # `agentlake status`
    on_disk = sorted(folder.glob("*.seg"))
    assert on_disk and sum(p.stat().st_size for p in on_disk) == spill["bytes"]
    reopened = SpillSink(MemorySink(), folder, max_bytes=1 << 20)  # what a new process finds on disk
    reopened.open()
    assert (reopened.records, reopened.bytes) == (3, spill["bytes"])
    lt = LoopThread()
    lt.run(reopened.close())
    lt.close()

    broker = LocalBroker(port=port, log_path=tmp_path / "tansu.log")
    try:
        with running_gateway(settings) as (base, server):
            assert spill_of(base)["records"] == 3  # a restarted gateway picks the spill up
            for i in range(3, 5):
                call(base, f"call {i}")
            wait_until(lambda: spill_of(base)["records"] == 5, 10, "all calls in the spill")
            broker.start()
            ensure_topics(settings.kafka, broker.bootstrap)
            wait_until(lambda: spill_of(base)["records"] == 0, 60, "the spill to drain into Kafka")
            assert spill_of(base)["dropped"] == 0 and spill_of(base)["sent"] == 5
        assert not list(folder.glob("*.seg"))  # acknowledged segments are removed
        records = read_topic(settings.kafka, settings.kafka.spans_topic, expect=5, timeout=30)
    finally:
        broker.stop()
    texts = []
    span_ids = set()
    for rec in records:
        (span,) = ExportTraceServiceRequest.FromString(rec.value).resource_spans[0].scope_spans[0].spans
        span_ids.add(span.span_id)
        attrs = {kv.key: kv.value.string_value for kv in span.attributes}
        assert attrs[A.ROLLOUT_ID] == "spilled"
        texts.append(json.loads(attrs[A.GEN_AI_INPUT_MESSAGES])[0]["content"])
    assert texts == [f"call {i}" for i in range(5)]  # each call once, in the order it was made
    assert len(span_ids) == 5


def test_a_full_spill_drops_and_counts_but_answers_the_client(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, free_port(), spill_max_bytes=64 << 10)  # nothing listens there
    with running_gateway(settings) as (base, server):
        big = "x" * (25 << 10)  # ~25 KiB of prompt per span: two fit in 64 KiB, the third does not
        for i in range(3):
            call(base, f"{i} {big}")
        recorder = server.gateway.recorder
        wait_until(lambda: recorder.recorded_spans + recorder.record_failures == 3, 10, "3 calls")
        spill = spill_of(base)
        assert spill["records"] == 2 and spill["dropped"] == 1 and int(spill["bytes"]) <= 64 << 10
        assert httpx.get(f"{base}/health", timeout=5).json()["record_failures"] == 1
        assert ", 1 dropped" in (gateway_spill(f"{base}/health", timeout_s=5) or "")


def test_one_gateway_per_spill_folder(tmp_path: Path) -> None:
    first = SpillSink(MemorySink(), tmp_path, max_bytes=1 << 20)
    first.open()
    with pytest.raises(Exception, match="another gateway"):
        SpillSink(MemorySink(), tmp_path, max_bytes=1 << 20).open()
    lt = LoopThread()
    lt.run(first.close())
    lt.close()


def test_segments_roll_a_torn_tail_is_cut_and_the_log_drains_in_order(tmp_path: Path) -> None:
    """The on-disk log itself. The sink behind it is the project's in-memory one (``down`` refuses
    like a broker that is away): the real-broker test above covers Kafka; this one the file format,
    with a real torn write (bytes of half a frame appended to the last segment, as a crash leaves)."""
    inner = MemorySink()
    inner.down = True
    records = [Record("t", str(i).encode(), bytes([i % 256]) * 1024, [("h", b"v")], 1) for i in range(100)]

    async def fill() -> None:
        spill = SpillSink(inner, tmp_path, max_bytes=1 << 20, segment_bytes=64 << 10)
        spill.start()
        for r in records:
            await spill.send([r])
        await asyncio.sleep(0.3)  # the forwarder tries, and fails, meanwhile
        assert spill.records == 100 and spill.last_error
        await spill.close()

    asyncio.run(fill())
    segments = sorted(tmp_path.glob("*.seg"))
    assert len(segments) == 2  # 100 KiB in segments of 64 KiB
    with open(segments[-1], "ab") as f:
        f.write(b"\x00\x00\x03\xe8\x12\x34\x56\x78" + b"half a frame")
    torn = segments[-1].stat().st_size

    async def drain() -> None:
        spill = SpillSink(inner, tmp_path, max_bytes=1 << 20, segment_bytes=64 << 10)
        spill.open()
        assert spill.records == 100 and segments[-1].stat().st_size == torn - 20
        inner.down = False
        spill.start()
        for _ in range(200):
            if not spill.records:
                break
            await asyncio.sleep(0.02)
        assert spill.stats()["records"] == 0 and spill.sent == 100
        await spill.send([records[0]])  # the log goes on after a drain
        await spill.close()

    asyncio.run(drain())
    assert [r.key for r in inner.records[:100]] == [str(i).encode() for i in range(100)]
    assert [r.value for r in inner.records[:100]] == [r.value for r in records]
    assert inner.records[0].headers == [("h", b"v")] and inner.records[0].topic == "t"
    assert len(inner.records) == 101 and not segments[0].exists()
