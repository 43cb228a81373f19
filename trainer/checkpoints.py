"""Checkpoints: one folder per model version, weights as safetensors, metadata as a plain dict.

    <checkpoint_dir>/<version>/
        adapter_model.safetensors + adapter_config.json   (LoRA, what vLLM's load_lora_adapter reads)
        model.safetensors + config.json + tokenizer files  (full fine-tune, a servable HF folder)
        checkpoint.json   {"version", "parent_version", "config", "metrics", "data", ...}
        optimizer.pt      AdamW state, so the next version can resume the moments
        manifest.json     sha256 and size of every other file (trainer.artifacts stores and checks it)

A folder is written under a temporary name and renamed into place, so vLLM never sees half of one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.artifacts import write_manifest
from trainer.config import TrainConfig
from trainer.errors import TrainerError

META_FILE = "checkpoint.json"
OPTIMIZER_FILE = "optimizer.pt"


def save_checkpoint(
    folder: str | Path,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    cfg: TrainConfig,
    meta: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Write one version's folder atomically and return its absolute path."""
    final = Path(folder).absolute()
    if final.exists():
        raise TrainerError(f"checkpoint folder {final} already exists; versions are never overwritten")
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # peft's save_pretrained writes only the adapter; a plain model writes every weight.
    # (torch types a Module's undeclared attributes as Tensor | Module: this one is a transformers/peft model)
    model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]
    if cfg.finetune == "full" and tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    (tmp / META_FILE).write_text(json.dumps({**meta, "config": cfg.recorded()}, indent=2, default=str))
    if optimizer is not None and cfg.save_optimizer:
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    write_manifest(tmp)  # last: it hashes every file above
    tmp.rename(final)
    return final


def load_meta(folder: str | Path) -> dict[str, Any]:
    """The plain dict saved with a checkpoint (its config under ``"config"``)."""
    path = Path(folder) / META_FILE
    if not path.exists():
        raise TrainerError(f"{folder} is not a trainer checkpoint (no {META_FILE})")
    return json.loads(path.read_text())


def load_optimizer_state(folder: str | Path) -> dict[str, Any] | None:
    """The parent's AdamW state, or None when it was not saved."""
    path = Path(folder) / OPTIMIZER_FILE
    return torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None
