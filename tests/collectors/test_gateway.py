"""The gateway: forced token ids/logprobs, client-shaped answers, spans, errors, pause/resume.

Fast tests talk to an in-process, OpenAI/vLLM-shaped upstream through httpx's ASGI transport:
they need exact control over upstream answers (a 500, a timeout, a call held open while we
pause), which a real model server cannot give. The response shape mirrors vLLM 0.3x with
``return_token_ids`` (top-level ``prompt_token_ids``, ``choices[].token_ids``). The slow test at
the end runs the same checks against a real vLLM serving SmolLM2-135M.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors.gateway.proxy import Gateway
from collectors.gateway.routes import create_app
from collectors.gateway.serve import GatewayServer
from collectors.sink import MemorySink
from pipelines.bronze.decoding import KafkaRecord, decode_spans
from schemas import attributes as A
from schemas.config import Settings, load_settings
from trainer.artifacts import write_manifest

UPSTREAM = "http://vllm.test"
pytestmark = pytest.mark.anyio


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


class FakeVllm:
    """Answers like vLLM; records what it was asked; ``hold`` keeps a call open until released."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.model_headers: list[dict[str, str]] = []  # of the /v1/models requests
        self.fail: int | None = None
        self.hold: asyncio.Event | None = None
        self.adapter_root = "/a/v2"  # the folder /v1/models reports policy-v2 was loaded from

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = await request.json()
            self.seen.append(body)
            self.headers.append(dict(request.headers))
            if self.hold is not None:
                await self.hold.wait()
            if self.fail:
                return Response(
                    b'{"object":"error","message":"boom","code":500}', self.fail, media_type="application/json"
                )
            rid = f"c{len(self.seen)}"  # a new response id per call: c1, c2, ...
            n = int(body.get("n") or 1)  # choice c samples tokens 11+10c.. with logprobs -0.5(i+1)-c
            ids = [11, 12, 13]
            lps = (
                {
                    "content": [
                        {"token": "t", "logprob": -0.5 * (i + 1), "bytes": [], "top_logprobs": []} for i in range(3)
                    ]
                }
                if body.get("logprobs")
                else None
            )

            def choice_ids(c: int) -> list[int]:
                return [t + 10 * c for t in ids]

            def choice_lps(c: int, i: int | None = None) -> dict[str, Any] | None:
                if lps is None:
                    return None
                content = [{**x, "logprob": x["logprob"] - c} for x in lps["content"]]
                return {"content": content if i is None else [content[i]]}

            if body.get("stream"):

                async def events() -> Any:
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "id": rid,
                                "model": "policy-v2",
                                "prompt_token_ids": [1, 2],
                                "choices": [
                                    {"index": 0, "delta": {"role": "assistant"}, "token_ids": [], "logprobs": None}
                                ],
                            }
                        )
                        + "\n\n"
                    )
                    for i in range(len(ids)):
                        for c in range(n):
                            yield (
                                "data: "
                                + json.dumps(
                                    {
                                        "id": rid,
                                        "model": "policy-v2",
                                        "choices": [
                                            {
                                                "index": c,
                                                "delta": {"content": f"w{i}" + "'" * c},
                                                "token_ids": [choice_ids(c)[i]],
                                                "logprobs": choice_lps(c, i),
                                                "finish_reason": "stop" if i == 2 else None,
                                            }
                                        ],
                                    }
                                )
                                + "\n\n"
                            )
                    if (body.get("stream_options") or {}).get("include_usage"):
                        yield (
                            "data: "
                            + json.dumps(
                                {
                                    "id": rid,
                                    "model": "policy-v2",
                                    "choices": [],
                                    "usage": {"prompt_tokens": 2, "completion_tokens": 3},
                                }
                            )
                            + "\n\n"
                        )
                    yield "data: [DONE]\n\n"

                return StreamingResponse(events(), media_type="text/event-stream")
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "model": "policy-v2",
                    "prompt_token_ids": [1, 2] if body.get("return_token_ids") else None,
                    "choices": [
                        {
                            "index": c,
                            "message": {"role": "assistant", "content": "hi" + "!" * c},
                            "logprobs": choice_lps(c),
                            "finish_reason": "stop",
                            "token_ids": choice_ids(c) if body.get("return_token_ids") else None,
                        }
                        for c in range(n)
                    ],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
                }
            )

        async def models(request: Request) -> Response:
            self.model_headers.append(dict(request.headers))
            return JSONResponse(
                {
                    "object": "list",
                    "data": [
                        {"id": "base", "root": "/m", "parent": None},
                        {"id": "policy-v2", "root": self.adapter_root, "parent": "base"},
                    ],
                }
            )

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])


@pytest.fixture()
def fake() -> FakeVllm:
    return FakeVllm()


@pytest.fixture()
def gw(fake: FakeVllm) -> Iterator[tuple[Gateway, MemorySink]]:
    settings = load_settings(environ={}, overrides={"gateway": {"upstreams": [UPSTREAM]}})
    sink = MemorySink()
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(fake.app()))
    yield Gateway(settings, sink, client=upstream), sink


def client_for(gateway: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(create_app(gateway)), base_url="http://gw")


async def settle(gateway: Gateway) -> None:
    for _ in range(100):
        if not gateway.recorder.pending:
            return
        await asyncio.sleep(0.01)


def spans(sink: MemorySink) -> list[dict[str, Any]]:
    """The recorded spans, each with its record's key and its attributes as plain values."""
    out = []
    for rec in sink.records:
        req = ExportTraceServiceRequest.FromString(rec.value)
        for s in req.resource_spans[0].scope_spans[0].spans:
            attrs = {}
            for kv in s.attributes:
                v = kv.value
                which = v.WhichOneof("value")
                attrs[kv.key] = (
                    [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
                    if which == "array_value"
                    else getattr(v, which)
                )
            out.append({"span": s, "key": rec.key, "attrs": attrs})
    return out


MSGS = [{"role": "user", "content": "hello"}]


async def test_forces_ids_and_logprobs_but_answers_in_openai_shape(gw, fake: FakeVllm) -> None:
    gateway, sink = gw
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    async with client_for(gateway) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"model": "policy-v2", "messages": MSGS},
            headers={"traceparent": parent, "x-agentlake-rollout-id": "roll-1", "authorization": "Bearer sk-upstream"},
        )
    assert r.status_code == 200
    body = r.json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["choices"][0]["logprobs"] is None and body["choices"][0]["message"]["content"] == "hi"
    up = fake.seen[0]
    assert up["return_token_ids"] is True and up["logprobs"] is True
    assert fake.headers[0]["authorization"] == "Bearer sk-upstream"
    assert fake.headers[0]["traceparent"].startswith("00-" + "ab" * 16)
    assert not any(k.startswith("x-agentlake") for k in fake.headers[0])
    await settle(gateway)
    (s,) = spans(sink)
    assert s["key"] == ("ab" * 16).encode()  # records are keyed by trace id; the pipeline resolves the rollout
    assert s["span"].trace_id.hex() == "ab" * 16 and s["span"].parent_span_id.hex() == "cd" * 8
    a = s["attrs"]
    assert a[A.LLM_PROMPT_TOKEN_IDS] == [1, 2] and a[A.LLM_COMPLETION_TOKEN_IDS] == [11, 12, 13]
    assert a[A.LLM_COMPLETION_LOGPROBS] == [-0.5, -1.0, -1.5]
    assert a[A.ROLLOUT_ID] == "roll-1" and a[A.LLM_SERVED_MODEL] == "policy-v2"
    assert a[A.LLM_ADAPTER] == "policy-v2"
    assert a[A.LLM_POLICY_VERSION] == "policy-v2@v2"  # adapter name @ the version folder it was loaded from
    assert a[A.GEN_AI_USAGE_INPUT_TOKENS] == 2 and a[A.LLM_LATENCY_MS] >= 0
    assert json.loads(a[A.GEN_AI_INPUT_MESSAGES]) == MSGS


async def test_the_requests_tools_and_tool_history_reach_the_spans_table_in_the_internal_shape(
    gw, fake: FakeVllm
) -> None:
    """The gateway records the request's `tools` (agentlake.llm.tools) beside its messages; decoded, the
    row holds both as the client sent them (the gateway's messages are OpenAI chat messages already)."""
    gateway, sink = gw
    tools = [{"type": "function", "function": {"name": "mul", "description": "a*b", "parameters": {"type": "object"}}}]
    history = [
        {"role": "user", "content": "17 * 24?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "mul", "arguments": '{"a": 17}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
    ]
    async with client_for(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "policy-v2", "messages": history, "tools": tools})
        assert r.status_code == 200
    await settle(gateway)
    (s,) = spans(sink)
    assert json.loads(s["attrs"][A.LLM_TOOLS]) == tools
    table, quarantined = decode_spans(
        KafkaRecord(rec.topic, 0, i, rec.key, rec.value, rec.headers) for i, rec in enumerate(sink.records)
    )
    assert quarantined == []
    (row,) = table.to_pylist()
    assert json.loads(row["tools"]) == tools and json.loads(row["input_messages"]) == history
    assert json.loads(row["output_messages"]) == [{"role": "assistant", "content": "hi"}]
    assert A.LLM_TOOLS not in json.loads(row["attributes"])


async def test_each_call_carries_the_served_adapters_manifest_hash_into_the_spans_table(
    gw, fake: FakeVllm, tmp_path: Path
) -> None:
    """The gateway reads ``manifest.json`` in the folder the upstream reports for the adapter.

    The upstream is the stand-in above: a real vLLM reports the same ``root`` for a loaded LoRA, and
    the hash a real one serves is checked by the two-replica release test (tests/fixtures_vllm.py).
    The version folder here is a real one, its manifest written by the trainer's own code.
    """
    gateway, sink = gw
    folder = tmp_path / "models" / "v0002"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of v0002")
    digest = write_manifest(folder)
    fake.adapter_root = str(folder)
    async with client_for(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "policy-v2", "messages": MSGS})
        assert r.status_code == 200
        await settle(gateway)
        # The folder is rewritten in place (same path, one more file): the next call carries the new hash.
        (folder / "adapter_config.json").write_text("{}")
        changed = write_manifest(folder)
        r = await c.post("/v1/chat/completions", json={"model": "policy-v2", "messages": MSGS})
        assert r.status_code == 200
    await settle(gateway)
    first, again = (s["attrs"] for s in spans(sink))
    assert first[A.LLM_POLICY_VERSION] == "policy-v2@v0002" and first[A.LLM_POLICY_SHA256] == digest
    assert again[A.LLM_POLICY_SHA256] == changed != digest

    # Decoded as ingestion does: the hash is a typed column of `spans`, not left in the JSON attributes.
    table, quarantined = decode_spans(
        KafkaRecord(rec.topic, 0, i, rec.key, rec.value, rec.headers) for i, rec in enumerate(sink.records)
    )
    assert quarantined == []
    rows = table.select(["policy_version", "policy_sha256", "attributes"]).to_pylist()
    assert [(r["policy_version"], r["policy_sha256"]) for r in rows] == [
        ("policy-v2@v0002", digest),
        ("policy-v2@v0002", changed),
    ]
    assert all(A.LLM_POLICY_SHA256 not in json.loads(r["attributes"]) for r in rows)


async def test_vllms_api_key_goes_upstream_in_place_of_the_clients(
    fake: FakeVllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_GATEWAY_VLLM_KEY", "vllm-secret")
    settings = load_settings(
        environ={},
        overrides={"gateway": {"upstreams": [UPSTREAM]}, "vllm": {"api_key_env": "TEST_GATEWAY_VLLM_KEY"}},
    )
    sink = MemorySink()
    gateway = Gateway(settings, sink, client=httpx.AsyncClient(transport=httpx.ASGITransport(fake.app())))
    async with client_for(gateway) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"model": "policy-v2", "messages": MSGS},
            headers={"authorization": "Bearer sk-client"},
        )
        models = await c.get("/v1/models")
    assert r.status_code == 200 and models.status_code == 200
    await settle(gateway)
    assert fake.headers[0]["authorization"] == "Bearer vllm-secret"
    assert fake.model_headers and {h["authorization"] for h in fake.model_headers} == {"Bearer vllm-secret"}
    assert spans(sink)[0]["attrs"][A.LLM_POLICY_VERSION] == "policy-v2@v2"  # its /v1/models lookup was let in


async def test_client_asking_for_extras_keeps_them_and_path_prefix_names_rollout(gw, fake: FakeVllm) -> None:
    gateway, sink = gw
    async with client_for(gateway) as c:
        r = await c.post(
            "/rollout/roll-7/v1/chat/completions",
            json={"model": "m", "messages": MSGS, "return_token_ids": True, "logprobs": True},
        )
    body = r.json()
    assert body["prompt_token_ids"] == [1, 2] and body["choices"][0]["token_ids"] == [11, 12, 13]
    assert len(body["choices"][0]["logprobs"]["content"]) == 3
    await settle(gateway)
    assert spans(sink)[0]["attrs"][A.ROLLOUT_ID] == "roll-7"


async def test_streaming_relays_chunks_and_records_ids(gw, fake: FakeVllm) -> None:
    gateway, sink = gw
    async with client_for(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "stream": True})
    events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in ch and "prompt_token_ids" not in ch for ch in chunks)  # client did not ask
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == "w0w1w2"
    assert fake.seen[0]["stream_options"] == {"include_usage": True}
    await settle(gateway)
    (s,) = spans(sink)
    assert s["attrs"][A.LLM_COMPLETION_TOKEN_IDS] == [11, 12, 13] and s["attrs"][A.LLM_PROMPT_TOKEN_IDS] == [1, 2]
    assert s["attrs"][A.LLM_STREAMED] is True and s["attrs"][A.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert s["span"].status.code == s["span"].status.STATUS_CODE_OK


@pytest.mark.parametrize("stream", [False, True])
async def test_each_of_n_choices_is_its_own_call(gw, fake: FakeVllm, stream: bool) -> None:
    """Issue 14, finding 7b: with ``n > 1`` every choice was recorded under one response id, so the
    pipeline (one call per response id) kept one of them."""
    gateway, sink = gw
    async with client_for(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "n": 3, "stream": stream})
    assert r.status_code == 200
    await settle(gateway)
    got = sorted(spans(sink), key=lambda s: s["attrs"][A.LLM_CHOICE_INDEX])
    assert [s["attrs"][A.LLM_CHOICE_INDEX] for s in got] == [0, 1, 2]
    assert [s["attrs"][A.LLM_RESPONSE_ID] for s in got] == ["c1", "c1#1", "c1#2"]
    assert {s["attrs"][A.GEN_AI_RESPONSE_ID] for s in got} == {"c1"}  # the provider's id, as clients record it
    assert [s["attrs"][A.LLM_COMPLETION_TOKEN_IDS] for s in got] == [[11, 12, 13], [21, 22, 23], [31, 32, 33]]
    assert [s["attrs"][A.LLM_COMPLETION_LOGPROBS] for s in got] == [[-0.5 - c, -1.0 - c, -1.5 - c] for c in range(3)]
    assert all(s["attrs"][A.LLM_PROMPT_TOKEN_IDS] == [1, 2] for s in got)
    assert len({s["span"].span_id for s in got}) == 3 and len({s["span"].trace_id for s in got}) == 1
    if not stream:
        assert all(s["attrs"][A.GEN_AI_USAGE_OUTPUT_TOKENS] == 3 for s in got)  # each choice its own count


async def test_end_rollout_records_status_and_reward(gw) -> None:
    gateway, sink = gw
    async with client_for(gateway) as c:
        bad = await c.post("/rollout/r9/end", json={"status": "done"})
        assert bad.status_code == 400 and "status" in bad.json()["error"]["message"]
        assert (await c.post("/rollout/r9/end", json={"reward": "high"})).status_code == 400
        r = await c.post(
            "/rollout/r9/end",
            json={"reward": 0.75, "reward_name": "accuracy"},
            headers={"x-agentlake-attempt-id": "a2"},
        )
        assert r.status_code == 200 and r.json() == {"rollout_id": "r9", "status": "finished", "reward": 0.75}
        assert (await c.post("/rollout/r10/end", json={"status": "failed"})).json()["status"] == "failed"
    root, reward, failed = spans(sink)
    assert root["span"].name == A.ROLLOUT_SPAN_NAME and not root["span"].parent_span_id
    assert root["attrs"] == {A.ROLLOUT_ID: "r9", A.ATTEMPT_ID: "a2", A.ROLLOUT_STATUS: "finished"}
    assert reward["span"].name == A.REWARD_SPAN_NAME and reward["span"].parent_span_id == root["span"].span_id
    assert reward["attrs"][A.REWARD_VALUE] == 0.75 and reward["attrs"][A.REWARD_NAME] == "accuracy"
    assert reward["attrs"][A.ROLLOUT_ID] == "r9" and reward["attrs"][A.ATTEMPT_ID] == "a2"
    assert failed["attrs"][A.ROLLOUT_STATUS] == "failed"
    assert failed["span"].status.code == failed["span"].status.STATUS_CODE_ERROR


async def test_upstream_errors_pass_through_unchanged(gw, fake: FakeVllm) -> None:
    gateway, sink = gw
    fake.fail = 500
    async with client_for(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS})
        assert r.status_code == 500 and r.content == b'{"object":"error","message":"boom","code":500}'
        bad = await c.post("/v1/chat/completions", content=b"{nope")
        assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    await settle(gateway)
    (s,) = spans(sink)
    assert s["span"].status.code == s["span"].status.STATUS_CODE_ERROR and "boom" in s["span"].status.message


async def test_upstream_timeout_is_504_and_recorded() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("upstream took too long", request=request)

    settings = load_settings(environ={}, overrides={"gateway": {"upstreams": [UPSTREAM]}})
    sink = MemorySink()
    gateway = Gateway(settings, sink, client=httpx.AsyncClient(transport=httpx.MockTransport(timeout)))
    async with client_for(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS})
    assert r.status_code == 504 and r.json()["error"]["type"] == "upstream_error"
    await settle(gateway)
    assert spans(sink)[0]["attrs"]["http.response.status_code"] == 504


async def test_pause_refuses_new_calls_while_in_flight_finish(gw, fake: FakeVllm) -> None:
    gateway, sink = gw
    fake.hold = asyncio.Event()
    async with client_for(gateway) as c:
        first = asyncio.create_task(c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS}))
        while gateway.in_flight == 0:
            await asyncio.sleep(0.01)
        pause = asyncio.create_task(c.post("/admin/pause?wait=5"))
        await asyncio.sleep(0.05)
        refused = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert not pause.done()  # still waiting for the in-flight call
        fake.hold.set()
        assert (await first).status_code == 200
        paused = (await pause).json()
        assert paused["paused"] is True and paused["idle"] is True and paused["in_flight"] == 0
        assert (await c.post("/admin/resume")).json()["paused"] is False
        assert (await c.post("/v1/chat/completions", json={"model": "m", "messages": MSGS})).status_code == 200
        models = (await c.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["base", "policy-v2"]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.kafka
def test_real_vllm_through_gateway(request: pytest.FixtureRequest, settings: Settings) -> None:
    """Chat, streamed chat and completions against vLLM serving SmolLM2-135M, spans into Kafka."""
    from tests.collectors.helpers import LoopThread, read_topic

    try:
        vllm = request.getfixturevalue("vllm_server")
    except pytest.FixtureLookupError:
        pytest.skip("the vllm_server fixture (tests/fixtures_vllm.py) is not available")
    settings.gateway.upstreams = [vllm.url]
    settings.gateway.port = 0
    lt = LoopThread()
    server = GatewayServer(settings)
    lt.run(server.start())
    try:
        base = f"http://127.0.0.1:{server.port}"
        chat = {"model": vllm.served_name, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
        r = httpx.post(f"{base}/rollout/r-real/v1/chat/completions", json=chat, timeout=120)
        assert r.status_code == 200, r.text
        assert "prompt_token_ids" not in r.json() and r.json()["choices"][0]["logprobs"] is None
        s = httpx.post(f"{base}/v1/chat/completions", json={**chat, "stream": True}, timeout=120)
        assert s.text.rstrip().endswith("data: [DONE]")
        c = httpx.post(
            f"{base}/v1/completions",
            json={"model": vllm.served_name, "prompt": "1, 2, 3,", "max_tokens": 5},
            timeout=120,
        )
        assert c.status_code == 200 and "token_ids" not in c.json()["choices"][0]
        err = httpx.post(f"{base}/v1/chat/completions", json={**chat, "model": "no-such-model"}, timeout=60)
        assert err.status_code == 404
    finally:
        lt.run(server.stop(), timeout=120)
        lt.close()
    records = read_topic(settings.kafka, settings.kafka.spans_topic, expect=4)
    calls = []
    for rec in records:
        req = ExportTraceServiceRequest.FromString(rec.value)
        for sp in req.resource_spans[0].scope_spans[0].spans:
            calls.append({kv.key: kv.value for kv in sp.attributes})
    ok = [a for a in calls if a["http.response.status_code"].int_value == 200]
    assert len(ok) == 3
    for a in ok:
        ids = [v.int_value for v in a[A.LLM_COMPLETION_TOKEN_IDS].array_value.values]
        lps = a[A.LLM_COMPLETION_LOGPROBS].array_value.values
        assert 0 < len(ids) <= 8 and len(lps) == len(ids)
        assert len(a[A.LLM_PROMPT_TOKEN_IDS].array_value.values) > 0
        assert a[A.GEN_AI_USAGE_OUTPUT_TOKENS].int_value == len(ids)
    assert any(a[A.ROLLOUT_ID].string_value == "r-real" for a in calls if A.ROLLOUT_ID in a)
