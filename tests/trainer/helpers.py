"""A tiny Llama policy with a real tokenizer, and transitions tables (the stand-in vLLM is tests/serving/helpers.py).

Nothing is downloaded: the SmolLM2 tokenizer is used when `agentlake model pull` has put it in
``.agentlake/models/smollm2-135m``; otherwise a word-level tokenizer is built with `tokenizers`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from deltalake import write_deltalake

from schemas.tables import TRANSITIONS
from trainer.config import TrainConfig

SMOLLM2_DIR = Path(__file__).resolve().parents[2] / ".agentlake" / "models" / "smollm2-135m"
WORDS = "what is two plus three four five six seven yes no maybe answer the calc result good bad ok".split()


def build_tokenizer() -> Any:
    """The pulled SmolLM2 tokenizer if present, else a word-level one over ``WORDS``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (SMOLLM2_DIR / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(SMOLLM2_DIR)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_tiny_model_dir(folder: Path, *, seed: int = 0) -> Path:
    """Save a randomly initialized 2-layer Llama (hidden 64) and its tokenizer as a HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def transition(
    i: int,
    prompt_ids: list[int],
    response_ids: list[int],
    *,
    advantage: float,
    logprobs: list[float] | None = None,
    loss_mask: list[int] | None = None,
    agent: str = "solver",
    policy_version: str | None = "base",
    policy_sha256: str | None = None,
    group: str = "g0",
) -> dict[str, Any]:
    """One TRANSITIONS row; reward and return equal the advantage unless a test says otherwise."""
    now = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    return {
        "transition_id": f"r{i:04d}/a0/0",
        "rollout_id": f"r{i:04d}",
        "attempt_id": "a0",
        "tenant": "default",
        "task_id": group,
        "group_id": group,
        "step": 0,
        "agent_name": agent,
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response_logprobs": logprobs,
        "loss_mask": loss_mask if loss_mask is not None else [1] * len(response_ids),
        "reward": advantage,
        "return": advantage,
        "advantage": advantage,
        "policy_version": policy_version,
        "policy_sha256": policy_sha256,
        "llm_model": "tiny",
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "created_at": now,
        "day": now.date(),
    }


def write_transitions(
    lake: Path | str, rows: list[dict[str, Any]], *, storage_options: dict[str, str] | None = None
) -> int:
    """Append rows to ``<lake>/transitions`` (partitioned by day, as the pipeline writes it); the new version."""
    from deltalake import DeltaTable

    uri = f"{lake}/transitions"
    data = pa.Table.from_pylist(rows, schema=TRANSITIONS)
    write_deltalake(uri, data, mode="append", partition_by=["day"], storage_options=storage_options)
    return DeltaTable(uri, storage_options=storage_options).version()


@torch.no_grad()
def sequence_logprob(model: torch.nn.Module, prompt: list[int], response: list[int]) -> float:
    """Sum of log p(response | prompt) under ``model``."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return float(lp[len(prompt) - 1 :].sum())


@torch.no_grad()
def token_logprobs_list(model: torch.nn.Module, prompt: list[int], response: list[int]) -> list[float]:
    """Per-token behaviour logprobs of ``response``, as vLLM would have returned them."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return [float(x) for x in lp[len(prompt) - 1 :]]


def small_round_config(lake: Path, model_dir: Path) -> TrainConfig:
    """A round over the tiny model that trains on whatever is new: rank 4, two steps per epoch at batch 2."""
    return TrainConfig(
        lake_root=str(lake),
        base_model=str(model_dir),
        checkpoint_dir=str(lake / "models"),
        min_new_transitions=1,
        lora_rank=4,
        batch_size=2,
        epochs=2,
        progress=False,
    )
