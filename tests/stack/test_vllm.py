"""vLLM server management: command line, venv idempotence, and a real server on the pulled model."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from agentlake.stack import vllm
from agentlake.stack.ports import free_port
from schemas.config import load_settings
from tests.fixtures_vllm import VllmServer

LLAMA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_argv_enables_runtime_lora_and_honours_extra_args(tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"vllm": {"venv": str(tmp_path / "v"), "max_lora_rank": 32}})
    argv = vllm.vllm_argv(settings, tmp_path / "m", port=8123, gpu=False)
    assert argv[:3] == [str(tmp_path / "v" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in argv
    assert argv[argv.index("--max-lora-rank") + 1] == "32"
    assert argv[argv.index("--served-model-name") + 1] == settings.model.base_served_name
    assert argv[argv.index("--dtype") + 1] == "float32"
    settings.vllm.extra_args = ["--dtype", "bfloat16"]
    assert vllm.vllm_argv(settings, tmp_path / "m", port=8123, gpu=False).count("--dtype") == 1
    assert vllm.vllm_env(gpu=False)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_argv_serves_tool_calls_with_the_parser_of_the_models_template(tmp_path: Path) -> None:
    """The shipped model: hermes (its folder carries our template, so no --chat-template); a model of your own:
    none unless named; "" turns it off; extra_args win; model.chat_template goes to --chat-template."""
    venv = {"venv": str(tmp_path / "v")}
    shipped = vllm.vllm_argv(load_settings(environ={}, overrides={"vllm": venv}), tmp_path / "m", port=1, gpu=False)
    assert _flag(shipped, "--tool-call-parser") == "hermes" and "--enable-auto-tool-choice" in shipped
    assert "--chat-template" not in shipped

    own = load_settings(environ={}, overrides={"vllm": venv, "model": {"base": str(tmp_path / "my-model")}})
    argv = vllm.vllm_argv(own, tmp_path / "m", port=1, gpu=False)
    assert "--tool-call-parser" not in argv and "--enable-auto-tool-choice" not in argv
    template = tmp_path / "tools.jinja"
    template.write_text("{{ messages }}")
    own.vllm.tool_call_parser = "llama3_json"
    own.model.chat_template = template
    argv = vllm.vllm_argv(own, tmp_path / "m", port=1, gpu=False)
    assert _flag(argv, "--tool-call-parser") == "llama3_json" and "--enable-auto-tool-choice" in argv
    assert _flag(argv, "--chat-template") == str(template)

    off = load_settings(environ={}, overrides={"vllm": {**venv, "tool_call_parser": ""}})
    argv = vllm.vllm_argv(off, tmp_path / "m", port=1, gpu=False)
    assert "--tool-call-parser" not in argv and "--enable-auto-tool-choice" not in argv

    by_hand = ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic", "--chat-template=/t.jinja"]
    mine = load_settings(
        environ={}, overrides={"vllm": {**venv, "extra_args": by_hand}, "model": {"chat_template": str(template)}}
    )
    argv = vllm.vllm_argv(mine, tmp_path / "m", port=1, gpu=False)
    assert argv.count("--tool-call-parser") == 1 and argv.count("--enable-auto-tool-choice") == 1
    assert _flag(argv, "--tool-call-parser") == "pythonic" and "--chat-template" not in argv


def test_a_stamped_venv_is_reused_without_installing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / vllm.STAMP).write_text(vllm._stamp_value(vllm.has_gpu()))
    settings = load_settings(environ={}, overrides={"vllm": {"venv": str(venv)}, "state": {"dir": str(tmp_path)}})
    started = time.monotonic()
    assert vllm.ensure_vllm_venv(settings) == venv / "bin" / "python"
    assert time.monotonic() - started < 1.0


def test_nothing_listening_is_not_healthy() -> None:
    assert not vllm.vllm_healthy(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)


def _chat(server: VllmServer, model: str, **extra: object) -> dict:
    body = {"model": model, "messages": QUESTION, "max_tokens": 16, "temperature": 0, **extra}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
@pytest.mark.vllm
def test_chat_returns_token_ids_and_logprobs_that_match_transformers(vllm_server: VllmServer) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert vllm.vllm_healthy(vllm_server.url, served_name=vllm_server.served_name)
    reply = _chat(vllm_server, vllm_server.served_name, return_token_ids=True, logprobs=True)
    choice = reply["choices"][0]
    prompt_ids, token_ids = reply["prompt_token_ids"], choice["token_ids"]
    logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert "Paris" in choice["message"]["content"]
    assert len(token_ids) == len(logprobs) > 0

    # The server tokenizes with the same chat template, and its fp32 logprobs are the trainer's.
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_path)
    expected_prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=True)
    assert prompt_ids == list(expected_prompt["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_path)
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]  # (T, V): position t predicts token t+1
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-2), (logprobs, expected.tolist())


def _random_adapter(base: Path, out: Path, seed: int) -> list[int]:
    """Save a random (non-zero) LoRA adapter; return peft's own greedy answer to QUESTION with it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=LLAMA_LINEAR, init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(base)
    inputs = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    return generated[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.slow
@pytest.mark.vllm
def test_lora_adapter_hot_loads_in_place(vllm_server: VllmServer, tmp_path: Path) -> None:
    name = "test-lora"
    base_ids = _chat(vllm_server, vllm_server.served_name, return_token_ids=True)["choices"][0]["token_ids"]
    try:
        for version, seed in (("v1", 1), ("v2", 2)):
            path = tmp_path / version  # a new path per version: vLLM caches adapters by path
            expected = _random_adapter(vllm_server.model_path, path, seed)
            body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
            loaded = httpx.post(f"{vllm_server.url}/v1/load_lora_adapter", json=body, timeout=120)
            assert loaded.status_code == 200, loaded.text
            got = _chat(vllm_server, name, return_token_ids=True)["choices"][0]["token_ids"]
            assert got[: len(expected)] == expected[: len(got)], version
            assert got != base_ids, version
        served = httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]
        assert {m["id"] for m in served} >= {vllm_server.served_name, name}
    finally:
        httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
