"""The gateway under generated malformed requests: never a 5xx of its own, and it keeps serving.

Issue 11. The real gateway (``GatewayServer`` on a socket, auth on, an admin token, a small body
limit) in front of a real HTTP upstream (uvicorn on a socket). The upstream is a small
vLLM-shaped app that answers any request it can parse with a fixed completion (streamed when
asked) and 400 otherwise, so that every 5xx seen is the gateway's own. Spans go through the
gateway's disk spill to an in-memory sink (thousands of Kafka round trips would only slow the
search). Afterwards the gateway must answer a good call, hold nothing in flight and have lost
no span.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors.gateway.serve import GatewayServer
from collectors.listen import QuietServer, bind
from collectors.sink import MemorySink
from schemas.config import load_settings
from tests.collectors.helpers import LoopThread, wait_until

EXAMPLES = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "1500")),  # `make test-fast` runs fewer
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TOKENS = {"tok-acme": "acme", "tok-beta": "beta"}
ADMIN_TOKEN = "adm-fuzz"
LIMIT = 64 << 10


def upstream_app() -> Starlette:
    """A vLLM-shaped upstream that never fails: a fixed answer to any JSON object, else 400."""

    async def complete(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"object": "error", "message": "bad JSON", "code": 400}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"object": "error", "message": "not an object", "code": 400}, 400)
        choice = {"index": 0, "token_ids": [11, 12], "finish_reason": "stop", "logprobs": None}
        if body.get("stream"):

            async def events() -> Any:
                chunk = {"id": "c", "model": "m", "prompt_token_ids": [1], "choices": [{**choice, "delta": {}}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                yield 'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        message = {"message": {"role": "assistant", "content": "ok"}, "text": "ok"}
        return JSONResponse({"id": "c", "model": "m", "prompt_token_ids": [1], "choices": [{**choice, **message}]})

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "root": "/m", "parent": None}]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/responses", complete, methods=["POST"]),  # a chat-shaped answer: the gateway copes
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, GatewayServer, MemorySink]]:
    lt = LoopThread()
    sock = bind("127.0.0.1", 0)
    upstream = QuietServer(uvicorn.Config(upstream_app(), log_level="warning", lifespan="off", access_log=False))

    async def serve_upstream() -> asyncio.Task[None]:
        task = asyncio.create_task(upstream.serve(sockets=[sock]))
        while not upstream.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        return task

    upstream_task = lt.run(serve_upstream())
    state: Path = tmp_path_factory.mktemp("gateway-fuzz")
    s = load_settings(
        environ={},
        discover=False,
        overrides={
            "state": {"dir": str(state)},
            "collector": {"auth_tokens": TOKENS},
            "gateway": {
                "port": 0,
                "upstreams": [f"http://127.0.0.1:{sock.getsockname()[1]}"],
                "admin_token": ADMIN_TOKEN,
                "max_body_bytes": LIMIT,
                "request_timeout_s": 10,
            },
        },
    )
    sink = MemorySink()
    server = GatewayServer(s, sink)
    lt.run(server.start())
    try:
        yield f"http://127.0.0.1:{server.port}", server, sink
    finally:
        lt.run(server.stop(), timeout=60)
        upstream.should_exit = True
        lt.run(asyncio.wait_for(upstream_task, 10))
        lt.close()


@pytest.fixture(scope="module")
def client(stack: tuple[str, GatewayServer, MemorySink]) -> Iterator[httpx.Client]:
    """One client for the whole search: its connections are reused, as an agent's would be."""
    with httpx.Client(base_url=stack[0], timeout=30) as c:
        yield c


# --- what to send ------------------------------------------------------------------------------------

_ascii = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
_keys = st.sampled_from(
    ["model", "messages", "prompt", "stream", "stream_options", "n", "logprobs", "top_logprobs"]
    + ["return_token_ids", "max_tokens", "role", "content", "include_usage", "status", "reward", "reward_name"]
    + ["input", "instructions", "tools", "type", "call_id", "output"]
) | st.text(max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)
CORPUS = [
    b'{"model": "m", "messages": [], "stream": true, "stream_options": "yes"}',
    b'{"model": "m", "messages": [], "stream": true, "stream_options": [1]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}], "n": 2}',
    b'{"model": "\\udfff", "prompt": "x"}',
    b'{"model": "m", "messages": [], "temperature": NaN}',
    b'{"model": "m", "messages": [], "temperature": -Infinity}',
    b'{"model": "m", "input": [{"type": "function_call"}, {"role": 5}], "tools": [{"type": "function"}]}',
    b'{"model": "m", "input": "hi", "stream": true, "instructions": "x"}',
    b'{"reward": 1e400}',
    b'{"status": {"a": 1}}',
    b"[" * 100_000,
    b'{"a": ' * 5000,
    b"\xff\xfe{}",
    b"",
    b"null",
    b'"just a string"',
    b"{" + b'"k":1,' * 20_000 + b'"k":1}',  # over the body limit
]
bodies = (
    json_values.map(lambda v: json.dumps(v).encode())
    | st.dictionaries(_keys, json_values, max_size=6).map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=300)
    | st.sampled_from(CORPUS)
)
_ids = st.sampled_from(["r1", "shared", "", " ", "%2F..%2F", "a" * 300]) | _ascii
paths = st.one_of(
    st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health"]),
    st.just("/admin/state"),
    st.sampled_from(["/admin/resume", "/admin/pause", "/nope", "/v1", "//v1/chat/completions"]),
    st.tuples(
        _ids, st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/end"])
    ).map(lambda t: f"/rollout/{quote(t[0], safe='')}{t[1]}"),
    _ascii.map(lambda w: f"/admin/pause?wait={quote(w)}"),
)
authorization = st.sampled_from(
    ["Bearer tok-acme", "Bearer tok-beta", f"Bearer {ADMIN_TOKEN}", "Bearer", "Bearer  ", "bearer tok-acme"]
    + ["Basic dG9rLWFjbWU=", "Bearer tok-acme tok-beta", "tok-acme"]
) | _ascii.map(lambda t: f"Bearer {t}")
header_names = st.sampled_from(
    ["traceparent", "tracestate", "x-agentlake-rollout-id", "x-agentlake-attempt-id", "x-agentlake-task-id"]
    + ["content-type", "content-encoding", "accept-encoding", "connection", "te", "x-other"]
)
header_values = (
    st.sampled_from(
        ["00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "00-" + "0" * 32 + "-" + "0" * 16 + "-00", "gzip", "br"]
        + ["application/json", "text/plain", "chunked", "close", ""]
    )
    | _ascii
)
# A client cannot send a value with spaces around it (HTTP strips them): strip, as the wire would.
header_values = header_values.map(str.strip)
authorization = authorization.map(str.strip)
headers = st.dictionaries(header_names, header_values, max_size=4).flatmap(
    lambda h: st.one_of(st.just(h), authorization.map(lambda a: {**h, "authorization": a}))
)


@EXAMPLES
@given(
    method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
    path=paths,
    body=bodies,
    hdrs=headers,
)
def test_no_request_gets_a_5xx(
    stack: tuple[str, GatewayServer, MemorySink],
    client: httpx.Client,
    method: str,
    path: str,
    body: bytes,
    hdrs: dict[str, str],
) -> None:
    server = stack[1]
    if "/admin/pause" in path and server.gateway.paused:
        path = "/admin/resume"  # keep most calls reaching the upstream, not 429
    r = client.request(method, path, content=body if method != "GET" else None, headers=hdrs)
    assert r.status_code < 500, (method, path, body[:200], hdrs, r.status_code, r.text[:300])


def test_still_serving_after_the_fuzz(stack: tuple[str, GatewayServer, MemorySink]) -> None:
    """Runs after the fuzz (file order): a good call answers, nothing leaked in flight, no span lost."""
    base, server, sink = stack
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.post(f"{base}/admin/resume", headers=admin, timeout=10).status_code == 200
    call = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{base}/v1/chat/completions", json=call, headers={"authorization": "Bearer tok-acme"}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    wait_until(lambda: server.gateway.in_flight == 0, 10, "no call in flight")
    # spans are written in the background after the answer: wait for those writes, then for the spill
    wait_until(lambda: not server.gateway.recorder.pending, 20, "the calls' spans handed to the spill")
    wait_until(lambda: server.spill.records == 0, 20, "the spill emptied into the sink")
    assert server.gateway.recorder.record_failures == 0 and server.spill.dropped == 0
    assert len(sink.records) >= server.gateway.recorder.recorded_spans > 0
