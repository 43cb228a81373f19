"""`agentlake model pull`: the converted SmolLM2 folder, idempotence, and registering local folders."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlake.cli import app
from trainer.model_store import (
    INDEX_FILE,
    ModelStoreError,
    pull_model,
    read_index,
    resolve_model,
    validate_model_folder,
)


@pytest.mark.slow
def test_pulled_smollm2_answers_a_chat_prompt(smollm2_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (smollm2_dir / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert "<|im_start|>" in tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert model.dtype == torch.float32

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = tokenizer.decode(inputs["input_ids"][0])
    assert prompt.endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.slow
def test_second_pull_is_instant_and_indexed(smollm2_dir: Path) -> None:
    cache = smollm2_dir.parent
    started = time.monotonic()
    entry = pull_model("smollm2-135m", cache)
    assert time.monotonic() - started < 2.0
    assert entry.folder == smollm2_dir and entry.kind == "converted"
    assert read_index(cache)["smollm2-135m"].folder == smollm2_dir
    assert resolve_model("smollm2-135m", cache) == smollm2_dir
    assert not list(cache.glob(".pull-*")), "a finished pull leaves no temporary folder"


def _hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer.json").write_text("{}")
    return path


def test_registering_a_local_folder_records_it_as_is(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "my-model")
    cache = tmp_path / "cache"
    entry = pull_model(str(folder), cache, name="mine")
    assert entry.kind == "registered" and entry.folder == folder
    assert not (cache / "mine").exists(), "a registered folder is not copied"
    index = json.loads((cache / INDEX_FILE).read_text())
    assert index["models"]["mine"]["path"] == str(folder)
    assert resolve_model("mine", cache) == folder


def test_cli_registers_a_folder_under_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _hf_folder(tmp_path / "policy-base")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTLAKE_CONFIG", raising=False)
    monkeypatch.setenv("AGENTLAKE_MODEL__CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["model", "pull", str(folder)])
    assert result.exit_code == 0, result.output
    assert read_index(tmp_path / "cache")["policy-base"].folder == folder


@pytest.mark.parametrize(
    ("files", "missing"),
    [({"tokenizer.json": "{}"}, "config.json"), ({"config.json": "{}"}, "tokenizer")],
)
def test_a_folder_without_config_or_tokenizer_is_refused(tmp_path: Path, files: dict, missing: str) -> None:
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    with pytest.raises(ModelStoreError, match=missing):
        validate_model_folder(tmp_path)
    with pytest.raises(ModelStoreError, match=missing):
        pull_model(str(tmp_path), tmp_path / "cache")


def test_an_unknown_name_says_what_is_known(tmp_path: Path) -> None:
    with pytest.raises(ModelStoreError, match="smollm2-135m"):
        pull_model("no-such-model", tmp_path)
    with pytest.raises(ModelStoreError, match="agentlake model pull"):
        resolve_model("no-such-model", tmp_path)
