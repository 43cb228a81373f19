"""Data-parallel training (issue 12): two gloo processes under torchrun train a round as one process does,
each holding the whole model (DDP) or half of it (FSDP, ``trainer.parallel = "fsdp"``)."""

from __future__ import annotations

import datetime as dt
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from schemas.config import Settings, load_settings
from schemas.lake import Lake
from tests.trainer.helpers import build_tokenizer, transition, write_transitions
from trainer.checkpoints import OPTIMIZER_FILE
from trainer.distributed import FAIL_HOOK, launch
from trainer.errors import TrainerError
from trainer.registry import Registry
from trainer.round import RoundResult, train_once

# 9 rows in micro-batches of 4: chunks of 4, 4 and 1, so one rank trains a stand-in at share 0 in the last;
# two micro-batches a step, two epochs: 4 optimizer steps, the last of each epoch a single micro-batch.
TRAIN: dict[str, Any] = dict(
    lora_rank=4, batch_size=4, grad_accum=2, epochs=2, learning_rate=1e-3, min_new_transitions=2, seed=3
)
N_ROWS = 9


def _rows(start: int = 0) -> list[dict[str, Any]]:
    """Prompts and responses of different lengths, mixed advantages, some with behaviour logprobs; ids from
    ``start`` (the same rows under new ids are new transitions to a second round)."""
    tok = build_tokenizer()
    words = "what is two plus three four five six seven yes no maybe answer".split()
    rng = random.Random(7)
    out = []
    for i in range(N_ROWS):
        prompt = tok(" ".join(rng.choices(words, k=rng.randint(3, 8))))["input_ids"]
        response = tok(" ".join(rng.choices(words, k=rng.randint(1, 6))))["input_ids"]
        logprobs = [-rng.uniform(0.5, 3.0) for _ in response] if i % 3 else None
        advantage = rng.choice([-1.0, 0.5, 1.0])
        out.append(transition(start + i, prompt, response, advantage=advantage, logprobs=logprobs))
    return out


def _settings(lake: Path, model: Path, **trainer: Any) -> Settings:
    return load_settings(
        environ={},
        overrides={
            "lake": {"root": str(lake)},
            "model": {"base": str(model)},
            "trainer": {**TRAIN, **trainer},
            "kafka": {"bootstrap_servers": ""},
        },
    )


def _weights(path: str | None, finetune: str = "lora") -> dict[str, torch.Tensor]:
    """The saved trained weights: the LoRA adapter, or the whole model."""
    assert path is not None
    return load_file(str(Path(path) / ("adapter_model.safetensors" if finetune == "lora" else "model.safetensors")))


def _logits(path: str | None, base: Path, finetune: str) -> torch.Tensor:
    """A saved version loaded as vLLM and the next round load it (peft over the base, or a HF folder): its logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert path is not None
    model = AutoModelForCausalLM.from_pretrained(base if finetune == "lora" else path, dtype=torch.float32)
    if finetune == "lora":
        model = PeftModel.from_pretrained(model, path)
    with torch.no_grad():
        return model(input_ids=torch.tensor([[3, 4, 5, 6, 7, 8]])).logits


def _one_and_two(
    lakes: tuple[Path, Path], model: Path, rows: list[dict[str, Any]], **trainer: Any
) -> tuple[RoundResult, RoundResult, list[str]]:
    """``rows`` added to both lakes, then a round on each: in this process, and as a job of 2 gloo processes
    (``trainer`` settings for both; one process ignores ``parallel``). Checks that the steps are the same."""
    for lake in lakes:
        write_transitions(lake, rows)
    t0 = time.monotonic()
    one = train_once(_settings(lakes[0], model, **trainer), progress=False)
    t1 = time.monotonic()
    lines: list[str] = []
    [two] = launch(_settings(lakes[1], model, **trainer), nproc=2, overrides={"progress": False}, echo=lines.append)
    print(f"{trainer}: 1 process {t1 - t0:.1f} s, 2 processes {time.monotonic() - t1:.1f} s (with torchrun's start)")
    assert one.version == two.version
    assert len(one.history) == len(two.history) == 4
    for a, b in zip(one.history, two.history, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4, abs=1e-6)
        assert b["tokens"] == a["tokens"]  # every rank's real tokens, summed
    return one, two, lines


def _max_diff(w1: dict[str, torch.Tensor], w2: dict[str, torch.Tensor]) -> torch.Tensor:
    """|w2 - w1| of every element, after checking both name the same tensors."""
    assert w1.keys() == w2.keys()
    return torch.cat([(w2[k] - w1[k]).abs().flatten() for k in w1])


@pytest.mark.slow  # two trainings, one of them a torchrun job: over a minute on 2 busy cores
@pytest.mark.parametrize(
    ("parallel", "finetune"), [("ddp", "lora"), ("fsdp", "lora"), ("fsdp", "full")], ids=["ddp", "fsdp", "fsdp-full"]
)
def test_two_gloo_processes_give_one_process_losses_and_weights(
    tmp_path: Path, tiny_model_dir: Path, parallel: str, finetune: str
) -> None:
    two_lake = tmp_path / "two"
    one, two, lines = _one_and_two(
        (tmp_path / "one", two_lake), tiny_model_dir, _rows(), finetune=finetune, parallel=parallel
    )
    assert two.version == "v0001"
    assert two.metrics["world_size"] == 2.0 and "world_size" not in one.metrics
    # FSDP did shard: both decoder layers, and the registry row says so
    assert (two.metrics.get("fsdp") == 1.0) is (parallel == "fsdp")
    assert any("FSDP: 2 decoder layers" in line for line in lines) is (parallel == "fsdp")
    w1, w2 = _weights(one.path, finetune), _weights(two.path, finetune)
    if finetune == "lora":  # LoRA's B starts at zero: training moved it, so equal weights say something
        assert max(float(w1[k].abs().max()) for k in w1 if "lora_B" in k) > 1e-4
    else:  # the saved model is the trained one, not the base it started from
        base = load_file(str(tiny_model_dir / "model.safetensors"))
        assert max(float((w2[k] - base[k]).abs().max()) for k in base) > 1e-4
    # AdamW divides each element's gradient by its own scale, so an element whose gradient is ~0 moves by
    # float noise amplified toward lr: weights agree to a tenth of one step (lr 1e-3), and nearly all to 1e-6.
    diffs = _max_diff(w1, w2)
    assert float(diffs.max()) < 1e-4
    assert float((diffs > 1e-6).float().mean()) < 0.01
    print(f"final {finetune} weights: max |2-process - 1-process| = {float(diffs.max()):.2e} over {diffs.numel()}")
    # both folders load as a policy does, and answer alike
    l1, l2 = _logits(one.path, tiny_model_dir, finetune), _logits(two.path, tiny_model_dir, finetune)
    assert torch.allclose(l1, l2, atol=1e-4)
    # rank 0 alone wrote the registry and the lineage: one version, its 9 rows once
    assert [r["version"] for r in Registry(Lake(str(two_lake))).rows()] == ["v0001"]
    lineage = Lake(str(two_lake)).table("training_lineage")
    assert lineage is not None and lineage.to_pyarrow_dataset().count_rows() == N_ROWS
    assert any("[rank 0]" in line for line in lines)  # the job's log came through echo
    print(f"per-step losses, 1 process: {[h['loss'] for h in one.history]}")
    print(f"per-step losses, 2 processes: {[h['loss'] for h in two.history]}")


@pytest.mark.slow  # two rounds, each in one process and as a torchrun job
def test_fsdp_continues_the_parents_adapter_and_adamw_moments(tmp_path: Path, tiny_model_dir: Path) -> None:
    # v0001 published, then new rows: each second round loads v0001's adapter and optimizer.pt, which the
    # FSDP ranks cut into their shards, and rank 0 saves the moments gathered back whole.
    lakes = (tmp_path / "one", tmp_path / "two")
    _one_and_two(lakes, tiny_model_dir, _rows(), parallel="fsdp")
    for lake in lakes:
        Registry(Lake(str(lake))).set_status("v0001", "published", published_at=dt.datetime.now(dt.UTC))
    one, two, _ = _one_and_two(lakes, tiny_model_dir, _rows(start=N_ROWS), parallel="fsdp")
    assert one.parent_version == two.parent_version == "v0001" and two.version == "v0002"
    assert float(_max_diff(_weights(one.path), _weights(two.path)).max()) < 1e-4
    assert one.path is not None and two.path is not None
    o1, o2 = (torch.load(Path(p) / OPTIMIZER_FILE, weights_only=True) for p in (one.path, two.path))
    assert o1["state"].keys() == o2["state"].keys() and len(o1["state"]) > 0
    for i, s in o1["state"].items():
        assert float(s["step"]) == float(o2["state"][i]["step"]) == 8.0  # 4 steps in each round
        assert torch.allclose(s["exp_avg"], o2["state"][i]["exp_avg"], atol=1e-6)
        assert torch.allclose(s["exp_avg_sq"], o2["state"][i]["exp_avg_sq"], atol=1e-8, rtol=1e-3)


@pytest.mark.slow  # torchrun job of 2 ranks: 15-30 s on 2 busy cores
def test_a_failing_rank_ends_the_job_with_its_error(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FAIL_HOOK is a test-only hook in trainer.distributed.main: rank 1 raises while rank 0 goes on into
    # the round and waits for it in a collective.
    lake = tmp_path / "lake"
    write_transitions(lake, _rows())
    monkeypatch.setenv(FAIL_HOOK, "1")
    t0 = time.monotonic()
    with pytest.raises(TrainerError, match=r"rank 1 of 2: TrainerError: injected failure on rank 1"):
        launch(_settings(lake, tiny_model_dir), nproc=2, overrides={"progress": False}, echo=lambda _: None)
    assert time.monotonic() - t0 < 120  # torchrun stops rank 0: no wait for the collective's timeout
    assert Registry(Lake(str(lake))).rows() == []


@pytest.mark.slow  # torchrun job of 2 ranks: 15-30 s on 2 busy cores
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_policy_asset_launches_the_multi_process_job(tmp_path: Path, tiny_model_dir: Path, parallel: str) -> None:
    from dagster import materialize

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import KafkaResource, LakeResource, TrainerResource

    lake = tmp_path / "lake"
    write_transitions(lake, _rows())
    resource = TrainerResource(
        lake=LakeResource(root=str(lake)),
        kafka=KafkaResource(bootstrap_servers="127.0.0.1:1", spans_topic="s", rewards_topic="r"),
        trainer={**TRAIN, "nproc": 2, "epochs": 1, "parallel": parallel},
        model={"base": str(tiny_model_dir)},
        publish=False,
    )
    result = materialize([policy], resources={"trainer": resource})
    assert result.success
    [mat] = result.asset_materializations_for_node("policy")
    assert mat.metadata["version"].value == "v0001"
    assert mat.metadata["world_size"].value == 2.0
    assert ("fsdp" in mat.metadata) is (parallel == "fsdp")
    assert [r["version"] for r in Registry(Lake(str(lake))).rows()] == ["v0001"]


@pytest.mark.slow  # torchrun job of 2 ranks: 15-30 s on 2 busy cores
def test_agentlake_train_nproc_parallel_fsdp_runs_the_job_and_reports_rank_0s_round(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from typer.testing import CliRunner

    from agentlake.cli import app

    lake = tmp_path / "lake"
    write_transitions(lake, _rows())
    config = tmp_path / "agentlake.toml"
    config.write_text(
        f'[lake]\nroot = "{lake}"\n[state]\ndir = "{tmp_path / "state"}"\n[model]\nbase = "{tiny_model_dir}"\n'
        "[trainer]\nlora_rank = 4\nbatch_size = 4\nmin_new_transitions = 2\n"
    )
    args = ["train", "--once", "--nproc", "2", "--parallel", "fsdp", "--max-steps", "1", "--config", str(config)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert f"v0001 from {N_ROWS} transitions" in out.output and "[rank 0]" in out.output
    assert "FSDP: 2 decoder layers" in out.output  # --parallel reached the ranks (the config says ddp)


def test_bf16_is_for_cuda_only() -> None:
    from schemas.errors import ConfigError
    from trainer.config import TrainConfig
    from trainer.train import bf16_autocast

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (bf16_autocast("auto", cpu), bf16_autocast("auto", cuda), bf16_autocast("fp32", cuda)) == (
        False,
        True,
        False,
    )
    assert bf16_autocast("bf16", cuda) is True
    with pytest.raises(ConfigError, match="needs CUDA"):
        bf16_autocast("bf16", cpu)
    with pytest.raises(ConfigError, match="needs CUDA"):
        TrainConfig(precision="bf16", device="cpu").validate()
    assert load_settings(environ={}, overrides={"trainer": {"precision": "bf16", "nproc": 2}}).trainer.nproc == 2


def test_parallel_is_ddp_or_fsdp() -> None:
    from schemas.errors import ConfigError

    assert load_settings(environ={}).trainer.parallel == "ddp"
    assert load_settings(environ={}, overrides={"trainer": {"parallel": "fsdp"}}).trainer.parallel == "fsdp"
    with pytest.raises(ConfigError, match="parallel"):
        load_settings(environ={}, overrides={"trainer": {"parallel": "zero3"}})
