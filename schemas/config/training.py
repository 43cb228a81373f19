"""``[trainer]`` and ``[credit]``: how a policy is trained, and how credit reaches each LLM call.

The modes are type aliases here, written once: ``trainer.config.TrainConfig`` and the credit
functions take the same ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from schemas.config.base import Section
from schemas.tables import TRAINABLE_TABLE_PATTERN

# The modes, each written once: the settings validate them, and trainer.config.TrainConfig, trainer.ranks
# and pipelines.gold.credit take the same types.
Algorithm = Literal["grpo", "ppo", "reinforce"]
Finetune = Literal["lora", "full"]
Parallel = Literal["ddp", "fsdp"]
Precision = Literal["auto", "fp32", "bf16"]
CreditMode = Literal["identical", "discounted", "per_step", "last_only"]
# An advantage estimator registered by name in pipelines.gold.estimators (built in: grpo, rloo,
# running_baseline, none); the gold step refuses a name nobody registered, listing the known ones.
AdvantageMode = str

# A trained agent's name (trainer.agents): it is matched exactly and becomes part of a served model name.
AGENT_LINE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


class TrainerSettings(Section):
    algorithm: Algorithm = "grpo"
    finetune: Finetune = "lora"
    lora_rank: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1)
    max_seq_len: int = Field(1024, ge=16)
    clip_eps: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    # Off-policy data (trainer.offpolicy): cap C of the truncated importance weight min(pi_old / pi_behaviour, C)
    # on rows from another policy version (0 or None: no correction), and the most versions a row's policy may
    # be behind the one trained from (older rows are skipped and counted; None: no limit).
    tis_cap: float | None = Field(2.0, ge=0)
    max_staleness: int | None = Field(None, ge=0)
    seed: int = 0
    min_new_transitions: int = Field(64, ge=1)
    schedule: str = "0 * * * *"
    # The tenants whose transitions this policy trains on (collector.auth_tokens names them); empty: all.
    tenants: list[str] = Field(default_factory=list)
    # The table rounds read: `transitions`, or a credit variant `transitions__<name>` (agentlake transitions rebuild).
    table: str = Field("transitions", pattern=TRAINABLE_TABLE_PATTERN)
    # One policy line per listed agent (trainer.lines): its own versions, trained on that agent's
    # transitions only, served as `<model.served_name>-<agent>` by the same vLLM (multi-LoRA: give it
    # `--max-loras` >= the number of lines). Empty: one policy for every agent, as `model.served_name`.
    agents: list[str] = Field(default_factory=list)
    # Processes that train a round together, data-parallel under torchrun on this machine (gloo on CPU,
    # NCCL with one GPU each; trainer.distributed); 1: one process and no process group.
    nproc: int = Field(1, ge=1)
    # How those processes split the model: "ddp", a full replica each (the default: fastest while one device
    # holds the model); "fsdp", each holds 1/nproc of the weights, gradients and AdamW state (FSDP2): choose it
    # when the parameters + gradients + optimizer state do not fit one device. The updates are the same.
    parallel: Parallel = "ddp"
    # The forward pass: "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32", or "bf16" (CUDA only).
    precision: Precision = "auto"
    # Recompute each decoder layer's activations in backward instead of keeping them: half the peak memory
    # for about a third more time per step (bench_train_memory.py, SmolLM2-135M LoRA, 8 x 512 tokens on CPU:
    # 14.7 -> 7.3 GB, 1.34x the time). Off: faster steps where memory is plentiful.
    gradient_checkpointing: bool = True
    # Held-out tasks (JSONL of {"prompt", "answer"}) that gate every publish, from the CLI and from the
    # `policy` asset alike: a version scoring lower than the serving one is `rejected` (serving.eval_gate).
    eval_tasks: Path | None = None

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, v: list[str]) -> list[str]:
        bad = [a for a in v if not re.fullmatch(AGENT_LINE_PATTERN, a)]
        if bad:
            raise ValueError(f"agent names must match {AGENT_LINE_PATTERN} (they become served model names): {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"an agent is listed twice: {v}")
        return v


class CreditSettings(Section):
    mode: CreditMode = "identical"
    gamma: float = Field(1.0, ge=0, le=1)
    advantage: AdvantageMode = "grpo"
    normalize_std: bool = True
    agent_pattern: str = "*"
    merge_calls: bool = False
    max_tokens: int = Field(4096, ge=1)
    idle_timeout_s: float = Field(300.0, gt=0)
    # How long after a finished rollout ended its final reward is waited for (None or 0: forever), and
    # what a rollout still without one then becomes: "drop" (left out, counted as no_reward_expired) or
    # a number, the reward it is trained with (its rows say reward_source = "default"; a real reward
    # that comes later replaces it).
    reward_horizon_s: float | None = Field(None, ge=0)
    missing_reward: Literal["drop"] | Annotated[float, Field(allow_inf_nan=False)] = "drop"
    # Lake-side reward functions (``agentlake.reward_fn``): the modules that define them, imported by the
    # `reward_functions` asset; and which reward name drives ``final_reward`` (None: the one named
    # "primary", else the first), e.g. "exact_answer" to train on what such a function scores.
    reward_modules: list[str] = Field(default_factory=list)
    reward: str | None = None
    # Calls whose tokens are known to differ from what the policy saw (token_status "mismatch": the served
    # model's /tokenize of the messages gave other prompt ids than the retokenizer) are left out of
    # `transitions` and counted (dropped_token_mismatch); True keeps and trains them. The `transitions`
    # asset check warns when a run's share of mismatched calls is above ``max_token_mismatch_rate``.
    train_token_mismatch: bool = False
    max_token_mismatch_rate: float = Field(0.05, ge=0, le=1)
    # Retokenized calls are verified against the policy's vLLM (``vllm.url``): its /tokenize of the same
    # messages and tools, answered within ``verify_timeout_s``; off or unreachable: "unverified".
    verify_tokens: bool = True
    verify_timeout_s: float = Field(2.0, gt=0)
    # Also compare the engine's prompt ids of exact calls with the policy template's rendering of their
    # recorded messages and tools (unequal: "mismatch"). Off by default: redaction rewrites the recorded
    # messages (pipelines.bronze.redact), so with it on every redacted call would read as a mismatch.
    check_exact_tokens: bool = False
