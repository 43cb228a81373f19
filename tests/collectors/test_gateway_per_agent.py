"""Gateway routing by agent (issue 13): a call from an agent with a policy line of its own is served by it.

The upstream here answers with the model it was asked for and lists one adapter per line, each loaded
from its version's folder (as the publisher loads them), so the recorded policy version tells which
line served the call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collectors.gateway.proxy import Gateway
from collectors.gateway.recording import route_model
from collectors.sink import MemorySink
from schemas import attributes as A
from schemas.config import load_settings
from tests.collectors.test_gateway import client_for, settle, spans

UPSTREAM = "http://vllm.test"
MSGS = [{"role": "user", "content": "hello"}]
ADAPTERS = {"agentlake-policy": "v0001", "agentlake-policy-planner": "v0003", "agentlake-policy-solver": "v0002"}
pytestmark = pytest.mark.anyio


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


class LinesVllm:
    """Serves the base model and one adapter per line; answers each call as the model it was asked for."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = await request.json()
            self.seen.append(body)
            if body["model"] not in {*ADAPTERS, "agentlake-base"}:
                return JSONResponse({"object": "error", "message": f"no model {body['model']}"}, 404)
            return JSONResponse(
                {
                    "id": f"c{len(self.seen)}",
                    "model": body["model"],
                    "prompt_token_ids": [1, 2],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hi"},
                            "logprobs": {"content": [{"token": "t", "logprob": -0.5}]},
                            "finish_reason": "stop",
                            "token_ids": [11],
                        }
                    ],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 1},
                }
            )

        async def models(_: Request) -> Response:
            data = [{"id": "agentlake-base", "root": "/m", "parent": None}]
            data += [{"id": k, "root": f"/lake/models/{v}", "parent": "agentlake-base"} for k, v in ADAPTERS.items()]
            return JSONResponse({"object": "list", "data": data})

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])


def _gateway(agents: list[str]) -> tuple[Gateway, MemorySink, LinesVllm]:
    settings = load_settings(
        environ={}, overrides={"gateway": {"upstreams": [UPSTREAM]}, "trainer": {"agents": agents}}
    )
    fake, sink = LinesVllm(), MemorySink()
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(fake.app()))
    return Gateway(settings, sink, client=upstream), sink, fake


@pytest.fixture()
def lines() -> Iterator[tuple[Gateway, MemorySink, LinesVllm]]:
    yield _gateway(["planner", "solver"])


async def _call(gateway: Gateway, model: str, agent: str | None) -> httpx.Response:
    headers = {"x-agentlake-agent": agent} if agent else {}
    async with client_for(gateway) as c:
        return await c.post("/v1/chat/completions", json={"model": model, "messages": MSGS}, headers=headers)


@pytest.mark.parametrize(
    ("model", "agent", "forwarded", "policy", "recorded_agent"),
    [
        ("agentlake-policy", "planner", "agentlake-policy-planner", "agentlake-policy-planner@v0003", "planner"),
        ("agentlake-policy", "solver", "agentlake-policy-solver", "agentlake-policy-solver@v0002", "solver"),
        ("agentlake-policy-solver", None, "agentlake-policy-solver", "agentlake-policy-solver@v0002", "solver"),
        ("agentlake-policy", "critic", "agentlake-policy", "agentlake-policy@v0001", "critic"),  # no line of its own
        ("agentlake-policy", None, "agentlake-policy", "agentlake-policy@v0001", None),
        ("agentlake-base", "planner", "agentlake-base", "agentlake-base", "planner"),  # asked for the base: kept
    ],
)
async def test_a_call_is_served_by_its_agents_line(
    lines: tuple[Gateway, MemorySink, LinesVllm],
    model: str,
    agent: str | None,
    forwarded: str,
    policy: str,
    recorded_agent: str | None,
) -> None:
    gateway, sink, fake = lines
    r = await _call(gateway, model, agent)
    assert r.status_code == 200, r.text
    assert fake.seen[-1]["model"] == forwarded
    await settle(gateway)
    (s,) = spans(sink)
    assert s["attrs"][A.LLM_POLICY_VERSION] == policy
    assert s["attrs"].get(A.AGENT_NAME) == recorded_agent


async def test_without_agents_listed_every_call_keeps_its_model() -> None:
    gateway, sink, fake = _gateway([])
    r = await _call(gateway, "agentlake-policy", "planner")
    assert r.status_code == 200
    assert fake.seen[-1]["model"] == "agentlake-policy"
    await settle(gateway)
    (s,) = spans(sink)
    assert s["attrs"][A.LLM_POLICY_VERSION] == "agentlake-policy@v0001"
    assert s["attrs"][A.AGENT_NAME] == "planner"  # the header still names the call's agent


def test_route_model_leaves_the_body_it_was_given_alone() -> None:
    body = {"model": "agentlake-policy", "messages": MSGS}
    routed, agent = route_model(body, "planner", served_name="agentlake-policy", lines=["planner"])
    assert routed["model"] == "agentlake-policy-planner" and agent == "planner"
    assert body["model"] == "agentlake-policy"
    assert route_model({"model": 3}, None, served_name="agentlake-policy", lines=["planner"]) == ({"model": 3}, None)
