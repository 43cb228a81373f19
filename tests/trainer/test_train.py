"""A tiny random Llama learns from fixed transitions: loss falls, good answers gain on bad ones."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from schemas.tables import TRANSITIONS
from tests.trainer.helpers import build_tokenizer, sequence_logprob, token_logprobs_list, transition
from trainer.checkpoints import load_meta, load_optimizer_state, save_checkpoint
from trainer.config import TrainConfig
from trainer.train import load_policy, train

QUESTIONS = ["what is two plus three", "what is four plus five", "what is six plus seven", "what is two plus four"]


def _fixed_transitions(model_dir: Path) -> tuple[pa.Table, list[tuple[list[int], list[int], list[int]]]]:
    """Per question a group of two answers: 'good ...' (advantage +1) and 'bad ...' (-1).

    Behaviour logprobs come from the initial policy, as vLLM would have returned them.
    """
    from transformers import AutoModelForCausalLM

    tok = build_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows, pairs = [], []
    for q, question in enumerate(QUESTIONS):
        prompt = tok(question + " answer")["input_ids"]
        good = tok("good result yes")["input_ids"]
        bad = tok("bad result no")["input_ids"]
        pairs.append((prompt, good, bad))
        for k, (resp, adv) in enumerate([(good, 1.0), (bad, -1.0)]):
            rows.append(
                transition(
                    2 * q + k,
                    prompt,
                    resp,
                    advantage=adv,
                    logprobs=token_logprobs_list(model, prompt, resp),
                    group=f"q{q}",
                )
            )
    return pa.Table.from_pylist(rows, schema=TRANSITIONS), pairs


def _margin(model: torch.nn.Module, pairs: list[tuple[list[int], list[int], list[int]]]) -> float:
    """Mean log p(good) - log p(bad) over the questions."""
    return sum(sequence_logprob(model, p, g) - sequence_logprob(model, p, b) for p, g, b in pairs) / len(pairs)


# reinforce stays in `make test-fast`; grpo and ppo take 12-14 s each on 2 busy cores
@pytest.mark.parametrize(
    "algorithm",
    [pytest.param("grpo", marks=pytest.mark.slow), pytest.param("ppo", marks=pytest.mark.slow), "reinforce"],
)
def test_training_lowers_loss_and_prefers_positive_advantage(tiny_model_dir: Path, algorithm: str) -> None:
    rows, pairs = _fixed_transitions(tiny_model_dir)
    cfg = TrainConfig(
        base_model=str(tiny_model_dir),
        algorithm=algorithm,  # type: ignore[arg-type]
        lora_rank=8,
        lora_alpha=16,
        learning_rate=3e-3,
        batch_size=4,
        grad_accum=2,
        epochs=8,
        progress=False,
        seed=0,
    )
    model, tok = load_policy(cfg)
    before = _margin(model, pairs)
    result = train(cfg, rows, model=model, tokenizer=tok)
    after = _margin(result.model, pairs)

    losses = [m["loss"] for m in result.history]
    assert len(losses) == 8  # 8 rows / 4 per micro-batch / 2 accumulated = 1 step per epoch
    assert losses[-1] < losses[0] - 0.05, losses
    assert after > before + 1.0, (before, after)
    assert all(m["tokens_per_s"] > 0 and m["tokens"] > 0 for m in result.history)
    assert {"kl", "clip_frac", "adv_mean", "grad_norm"} <= set(result.history[-1])
    if algorithm != "reinforce":
        assert result.history[-1]["clip_frac"] > 0  # the ratio left the trust region by the end


@pytest.mark.slow  # full fine-tuning with a reference model: ~6 s
def test_full_finetune_with_kl_and_checkpoint_roundtrip(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows, pairs = _fixed_transitions(tiny_model_dir)
    cfg = TrainConfig(
        base_model=str(tiny_model_dir),
        finetune="full",
        kl_coef=0.1,
        learning_rate=3e-3,
        batch_size=8,
        epochs=3,
        progress=False,
        pack=True,
        max_seq_len=64,
    )
    result = train(cfg, rows)
    assert result.history[-1]["kl"] > 0  # the frozen reference copy is being compared against
    assert _margin(result.model, pairs) > _margin(load_policy(cfg)[0], pairs)

    folder = save_checkpoint(
        tmp_path / "v0001",
        model=result.model,
        tokenizer=result.tokenizer,
        cfg=cfg,
        meta={"version": "v0001"},
        optimizer=result.optimizer,
    )
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    meta = load_meta(folder)
    assert TrainConfig.from_dict(meta["config"]) == cfg  # the checkpoint's config rebuilds the run
    assert load_optimizer_state(folder)["state"]  # AdamW moments, to resume from


def test_lora_kl_uses_the_base_model_as_reference(tiny_model_dir: Path) -> None:
    rows, _ = _fixed_transitions(tiny_model_dir)
    cfg = TrainConfig(
        base_model=str(tiny_model_dir),
        kl_coef=0.5,
        learning_rate=2e-2,
        batch_size=8,
        epochs=4,
        progress=False,
        lora_rank=4,
    )
    result = train(cfg, rows)
    kls = [m["kl"] for m in result.history]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # a fresh LoRA (B = 0) is the base model
    assert kls[-1] > 0


def _activation_bytes(model: torch.nn.Module, rows: pa.Table) -> int:
    """Bytes autograd keeps for backward in one training-mode forward of four rows: the decoder's activations
    only (a weight kept for backward is no copy; the logits are the same with or without checkpointing)."""
    from trainer.data import collate, to_examples
    from trainer.train import forward_logprobs

    batch = collate(to_examples(rows, max_seq_len=1024)[:4], pad_id=0)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    vocab = model.get_output_embeddings().weight.shape[0]
    held = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal held
        if t.untyped_storage().data_ptr() not in weights and (t.dim() == 0 or t.shape[-1] != vocab):
            held += t.numel() * t.element_size()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_logprobs(model, batch).sum()
    return held


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_gradient_checkpointing_trains_the_same_weights_and_keeps_fewer_activations(
    tiny_model_dir: Path, finetune: str
) -> None:
    """trainer.gradient_checkpointing (on by default) recomputes activations in backward: the same losses and
    weights as keeping them, with a fraction of the bytes autograd holds for backward (measured: 1/9)."""
    rows, _ = _fixed_transitions(tiny_model_dir)
    results, saved = {}, {}
    for on in (True, False):
        cfg = TrainConfig(
            base_model=str(tiny_model_dir),
            finetune=finetune,  # type: ignore[arg-type]
            lora_rank=8,
            lora_alpha=16,
            learning_rate=3e-3,
            batch_size=4,
            epochs=2,
            progress=False,
            seed=0,
            gradient_checkpointing=on,
        )
        results[on] = train(cfg, rows)
        saved[on] = _activation_bytes(results[on].model, rows)
    assert [m["loss"] for m in results[True].history] == pytest.approx([m["loss"] for m in results[False].history])
    trained, kept = results[True].model.state_dict(), results[False].model.state_dict()
    assert trained.keys() == kept.keys()
    for name, weight in trained.items():
        assert torch.allclose(weight, kept[name], atol=1e-6), name
    assert saved[True] < 0.5 * saved[False], saved


def test_loading_a_policy_logs_no_deprecation_from_peft(tiny_model_dir: Path) -> None:
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model: a FutureWarning in
    every training run's log that says nothing to the user (the trainer checkpoints with its own switch)."""
    cfg = TrainConfig(base_model=str(tiny_model_dir), lora_rank=8, lora_alpha=16, progress=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_policy(cfg)
    assert not [w for w in seen if "is_gradient_checkpointing" in str(w.message)]
