"""Issue 11: the gateway's lock, its tenants, its admin token and its body limit.

Before: every endpoint answered without credentials (an anonymous ``/admin/pause`` made every
chat call 429), spans were always tenant ``default``, any caller's rollout id merged calls into
another tenant's rollout, and a 200 MB body was buffered whole and forwarded upstream.

The fast tests use the in-process vLLM-shaped upstream of test_gateway.py (exact answers, and it
records what reached it). The body test runs the real gateway process and reads its peak memory;
the rollout test goes through a real broker and the Dagster assets into Delta.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from dagster import materialize

from agentlake.stack.ports import free_port
from collectors.gateway.proxy import Gateway
from collectors.gateway.serve import GatewayServer
from collectors.sink import MemorySink
from pipelines.defs.assets import all_assets
from pipelines.defs.resources import resources_from_settings
from schemas import attributes as A
from schemas import topics
from schemas.config import Settings, load_settings
from schemas.lake import Lake
from tests.collectors.helpers import LoopThread, wait_until
from tests.collectors.test_gateway import UPSTREAM, FakeVllm, client_for, settle, spans

TOKENS = {"tok-acme": "acme", "tok-beta": "beta"}
ACME = {"authorization": "Bearer tok-acme"}
BETA = {"authorization": "Bearer tok-beta"}
ADMIN = {"authorization": "Bearer adm-secret"}
CALL = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


def gateway_with(fake: FakeVllm, tokens: dict[str, str] | None = None, **gateway: object) -> tuple[Gateway, MemorySink]:
    settings = load_settings(
        environ={},
        discover=False,
        overrides={"collector": {"auth_tokens": tokens or {}}, "gateway": {"upstreams": [UPSTREAM], **gateway}},
    )
    sink = MemorySink()
    return Gateway(settings, sink, client=httpx.AsyncClient(transport=httpx.ASGITransport(fake.app()))), sink


def tenants(sink: MemorySink) -> list[str]:
    return [dict(r.headers)[topics.HEADER_TENANT].decode() for r in sink.records]


@pytest.mark.anyio
async def test_tokens_lock_every_tenant_endpoint_and_name_the_tenant() -> None:
    fake = FakeVllm()
    gateway, sink = gateway_with(fake, TOKENS)
    async with client_for(gateway) as c:
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/responses"),
            ("GET", "/v1/models"),
            ("POST", "/rollout/r1/v1/chat/completions"),
            ("POST", "/rollout/r1/end"),
        ):
            for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic tok-acme"}):
                r = await c.request(method, path, json=CALL, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
                assert r.json()["error"]["type"] == "authentication_error"
        assert fake.seen == [] and sink.records == []

        r = await c.post("/v1/chat/completions", json=CALL, headers=ACME)
        assert r.status_code == 200, r.text
        assert (await c.get("/v1/models", headers=BETA)).status_code == 200
    await settle(gateway)
    assert tenants(sink) == ["acme"]
    assert "authorization" not in fake.headers[0]  # the tenant's token stops at the gateway


@pytest.mark.anyio
async def test_anonymous_calls_only_without_tokens_or_when_allowed() -> None:
    fake = FakeVllm()
    local, local_sink = gateway_with(fake)  # no tokens: a local stack, open as before
    async with client_for(local) as c:
        r = await c.post("/v1/chat/completions", json=CALL, headers={"authorization": "Bearer sk-upstream"})
        assert r.status_code == 200
    await settle(local)
    assert tenants(local_sink) == [topics.DEFAULT_TENANT]
    assert fake.headers[0]["authorization"] == "Bearer sk-upstream"  # not ours: the upstream's key

    mixed, mixed_sink = gateway_with(fake, TOKENS, allow_anonymous=True)
    async with client_for(mixed) as c:
        assert (await c.post("/v1/chat/completions", json=CALL)).status_code == 200
        assert (await c.post("/v1/chat/completions", json=CALL, headers=BETA)).status_code == 200
    await settle(mixed)
    assert sorted(tenants(mixed_sink)) == ["beta", topics.DEFAULT_TENANT]

    locked, _ = gateway_with(fake, TOKENS, allow_anonymous=False)
    async with client_for(locked) as c:
        assert (await c.post("/v1/chat/completions", json=CALL)).status_code == 401


@pytest.mark.anyio
async def test_admin_endpoints_take_only_the_admin_token() -> None:
    fake = FakeVllm()
    gateway, _ = gateway_with(fake, TOKENS, admin_token="adm-secret")
    async with client_for(gateway) as c:
        for method, path in (("POST", "/admin/pause"), ("POST", "/admin/resume"), ("GET", "/admin/state")):
            assert (await c.request(method, path)).status_code == 401
            r = await c.request(method, path, headers=ACME)
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert not gateway.paused
        assert (await c.post("/v1/chat/completions", json=CALL, headers=ACME)).status_code == 200

        health = (await c.get("/health")).json()
        # no upstreams or counters for strangers; whether policy names are held for a loader (serving.loader)
        assert health == {"status": "ok", "paused": False, "restoring": False}
        assert "upstreams" in (await c.get("/health", headers=ADMIN)).json()

        r = await c.post("/admin/pause", headers=ADMIN)
        assert r.status_code == 200 and r.json()["paused"] is True
        assert (await c.post("/v1/chat/completions", json=CALL, headers=ACME)).status_code == 429
        assert (await c.get("/admin/state", headers=ADMIN)).json()["paused"] is True
        assert (await c.post("/admin/resume", headers=ADMIN)).json()["paused"] is False
        bad = await c.post("/admin/pause?wait=nan", headers=ADMIN)
        assert bad.status_code == 400 and not gateway.paused

    # Tokens but no admin token: the admin endpoints are off for everyone.
    closed, _ = gateway_with(fake, TOKENS)
    async with client_for(closed) as c:
        assert (await c.post("/admin/pause")).status_code == 403
        assert (await c.post("/admin/pause", headers=ACME)).status_code == 403
        assert not closed.paused


@pytest.mark.anyio
async def test_a_rollout_id_is_the_callers_own() -> None:
    """Tenant beta naming acme's rollout id (path, header, end) records under beta, never acme."""
    fake = FakeVllm()
    gateway, sink = gateway_with(fake, TOKENS)
    async with client_for(gateway) as c:
        assert (await c.post("/rollout/shared/v1/chat/completions", json=CALL, headers=ACME)).status_code == 200
        hdr = {**BETA, "x-agentlake-rollout-id": "shared"}
        assert (await c.post("/v1/chat/completions", json=CALL, headers=hdr)).status_code == 200
        assert (await c.post("/rollout/shared/end", json={"reward": 0.0}, headers=BETA)).status_code == 200
    await settle(gateway)
    got = [
        (tenant, s["attrs"].get(A.ROLLOUT_ID), s["span"].name)
        for s, tenant in zip(spans(sink), _per_span(sink), strict=True)
    ]
    assert [g for g in got if g[0] == "acme"] == [("acme", "shared", A.LLM_CALL_SPAN_NAME)]
    beta = sorted(g for g in got if g[0] == "beta")
    assert beta == sorted(
        ("beta", "shared", name) for name in (A.LLM_CALL_SPAN_NAME, A.ROLLOUT_SPAN_NAME, A.REWARD_SPAN_NAME)
    )


def _per_span(sink: MemorySink) -> list[str]:
    """The tenant of each span, in the order ``spans`` lists them."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    for record, tenant in zip(sink.records, tenants(sink), strict=True):
        n = len(ExportTraceServiceRequest.FromString(record.value).resource_spans[0].scope_spans[0].spans)
        out += [tenant] * n
    return out


@pytest.mark.anyio
async def test_body_over_the_limit_is_413_and_never_reaches_the_upstream() -> None:
    fake = FakeVllm()
    gateway, sink = gateway_with(fake, max_body_bytes=2048)
    big = {**CALL, "messages": [{"role": "user", "content": "x" * 4096}]}

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit must hold while reading
        body = json.dumps(big).encode()
        for i in range(0, len(body), 512):
            yield body[i : i + 512]

    async with client_for(gateway) as c:
        declared = await c.post("/v1/chat/completions", json=big)
        streamed = await c.post("/v1/chat/completions", content=chunked())
        end = await c.post("/rollout/r/end", json={"reward": 1.0, "pad": "x" * 4096})
        ok = await c.post("/v1/chat/completions", json=CALL)
    for r in (declared, streamed, end):
        assert r.status_code == 413, r.text
        message = r.json()["error"]["message"]
        assert "2048" in message and "gateway.max_body_bytes" in message
    assert ok.status_code == 200
    assert len(fake.seen) == 1


def test_body_limit_must_leave_room_in_a_kafka_record() -> None:
    settings = load_settings(
        environ={}, discover=False, overrides={"gateway": {"max_body_bytes": 12 << 20, "upstreams": [UPSTREAM]}}
    )
    with pytest.raises(ValueError, match="gateway.max_body_bytes"):
        Gateway(settings, MemorySink())


# --- a 200 MB body against the real gateway process -----------------------------------------------------


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def _post_huge(port: int, total: int, *, chunked: bool) -> bytes:
    """POST ``total`` bytes, stopping as soon as the gateway answers; return what it answered."""
    piece = b"x" * (1 << 20)
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    answer = b""
    try:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
        sock.sendall(head.encode())
        sent = 0
        while sent < total:
            if select.select([sock], [], [], 0)[0]:
                break  # answered before the body ended
            data = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        deadline = time.monotonic() + 30
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            if time.monotonic() > deadline:
                break
            try:
                more = sock.recv(65536)
            except ConnectionResetError:
                break
            if not more:
                break
            answer += more
    finally:
        sock.close()
    return answer


@pytest.mark.slow  # a gateway process and 400 MB sent: ~7 s
def test_a_200_mb_body_is_refused_without_being_buffered(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLAKE_")}
    env.update(
        AGENTLAKE_STATE_DIR=str(tmp_path / "state"),
        AGENTLAKE_GATEWAY__PORT=str(port),
        KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",  # no broker: calls would wait in the spill
        AGENTLAKE_GATEWAY__UPSTREAMS=f'["http://127.0.0.1:{free_port()}"]',
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors.gateway"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: _answers(port), 30, "the gateway")
        before = _peak_rss_kib(proc.pid)
        for chunked in (False, True):
            answer = _post_huge(port, 200 << 20, chunked=chunked)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
            assert b"gateway.max_body_bytes" in answer
        grown_mib = (_peak_rss_kib(proc.pid) - before) / 1024
        assert grown_mib < 48, f"the gateway's peak memory grew by {grown_mib:.0f} MiB for a refused body"
        assert _answers(port)
    finally:
        proc.terminate()
        proc.wait(15)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# --- tenants through the pipeline ------------------------------------------------------------------------


@pytest.fixture()
def locked_gateway(settings: Settings) -> Iterator[tuple[str, GatewayServer]]:
    settings.collector.auth_tokens = dict(TOKENS)
    settings.gateway.port = 0
    settings.gateway.upstreams = [UPSTREAM]
    lt = LoopThread()
    server = GatewayServer(settings, client=httpx.AsyncClient(transport=httpx.ASGITransport(FakeVllm().app())))
    lt.run(server.start())
    try:
        wait_until(lambda: server.sink.connected, 20, "the gateway's Kafka producer")  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{server.port}", server
    finally:
        lt.run(server.stop(), timeout=120)
        lt.close()


@pytest.mark.kafka
def test_another_tenant_cannot_join_or_end_a_rollout(
    settings: Settings, locked_gateway: tuple[str, GatewayServer]
) -> None:
    """acme runs rollout "shared" for three calls; beta names the same id for one call and ends it.
    The trajectories table holds two rollouts "shared": acme's still running with its three calls,
    beta's finished with one."""
    base, server = locked_gateway
    for _ in range(3):
        r = httpx.post(f"{base}/rollout/shared/v1/chat/completions", json=CALL, headers=ACME, timeout=30)
        assert r.status_code == 200, r.text
    r = httpx.post(
        f"{base}/v1/chat/completions", json=CALL, headers={**BETA, "x-agentlake-rollout-id": "shared"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert httpx.post(f"{base}/rollout/shared/end", json={"reward": 1.0}, headers=BETA, timeout=30).status_code == 200
    wait_until(lambda: server.gateway.recorder.recorded_spans == 5 and server.spill.records == 0, 20, "spans in Kafka")

    wanted = {"spans", "rewards", "trajectories"}  # not the policy: training is not under test
    assets = [a for a in all_assets if {k.to_user_string() for k in a.keys} <= wanted]
    result = materialize(assets, resources=resources_from_settings(settings))
    assert result.success
    traj = pl.read_delta(Lake(settings.lake.root).uri("trajectories")).filter(pl.col("rollout_id") == "shared")
    rows = {r["tenant"]: r for r in traj.to_dicts()}
    assert set(rows) == {"acme", "beta"}
    assert rows["acme"]["status"] == "running" and rows["acme"]["n_llm_calls"] == 3
    assert rows["acme"]["final_reward"] is None
    assert rows["beta"]["status"] == "finished" and rows["beta"]["n_llm_calls"] == 1
    assert rows["beta"]["final_reward"] == 1.0


# --- the publisher's pause -------------------------------------------------------------------------------


def test_the_publisher_pauses_a_locked_gateway_with_the_admin_token() -> None:
    """A trainer publishing a version pauses the gateway; once ``gateway.admin_token`` is set, only with it."""
    from serving.gateway_pause import GATEWAY_PAUSE, GATEWAY_RESUME, gateway_call
    from serving.publish import Publisher

    settings = load_settings(
        environ={},
        discover=False,
        overrides={
            "collector": {"auth_tokens": dict(TOKENS)},
            "gateway": {"upstreams": [UPSTREAM], "admin_token": "adm-secret", "port": 0},
        },
    )
    lt = LoopThread()
    server = GatewayServer(
        settings, MemorySink(), client=httpx.AsyncClient(transport=httpx.ASGITransport(FakeVllm().app()))
    )
    lt.run(server.start())
    try:
        settings.gateway.port = server.port
        url = settings.gateway.url
        assert not gateway_call(url, GATEWAY_PAUSE)  # no token: refused, publishing goes on unpaused
        assert not gateway_call(url, GATEWAY_PAUSE, headers=ACME)  # a tenant's token is not the admin's
        assert not server.gateway.paused
        headers = Publisher.from_settings(settings).gateway_headers
        assert gateway_call(url, GATEWAY_PAUSE, headers=headers) and server.gateway.paused
        assert gateway_call(url, GATEWAY_RESUME, headers=headers) and not server.gateway.paused
    finally:
        lt.run(server.stop(), timeout=60)
        lt.close()
