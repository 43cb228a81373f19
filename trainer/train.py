"""The training loop, top to bottom: setup, data, model, optimizer, loop. No Trainer class.

``train`` takes a config and transition rows and returns the trained model with its per-step
metrics; saving and registering are the caller's (``trainer.round.train_once``). LoRA through
peft is the default; ``finetune="full"`` trains every weight. On CUDA the forward pass runs
under bf16 autocast (weights and optimizer stay fp32; ``precision``); on CPU everything is fp32.

Data-parallel (a torchrun job, ``trainer.distributed``): every rank draws the same micro-batches in the
same order and trains its own shard of each, through DistributedDataParallel (``trainer.parallel =
"ddp"``) or FSDP2 (``"fsdp"``, ``fully_shard`` per decoder layer and on the whole model: each rank holds
1/N of the weights, gradients and AdamW state). A micro-batch's loss is a mean over its trained tokens
(PPO, REINFORCE) or its sequences (GRPO); a rank scales its shard's mean by its share of that count, so
the ranks' gradients sum to the one process's gradient over the same micro-batch (both wrappers average
over the ranks), and the update is the same up to float error. Under FSDP rank 0 keeps an unsharded copy
in CPU memory, into which the trained weights and AdamW state are gathered at the end
(``gather_to_rank0``), so the caller saves the same checkpoint as from one process. Without a process
group, the loop is the one-process loop: no wrapper, no communication, every share 1.

Rows sampled by another policy version than ``current_version`` (the one the round starts from)
are stale: before the first step one no-grad pass gives their proximal logprobs, and the loss
weights them by truncated importance sampling (``trainer.losses``, ``trainer.offpolicy``).
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from schemas.errors import ConfigError
from trainer.config import TrainConfig
from trainer.data import Batch, Example, collate, epoch_chunks, to_examples
from trainer.errors import TrainerError
from trainer.losses import LossOutput, grpo_loss, masked_entropy, ppo_clip_loss, reinforce_loss, token_logprobs
from trainer.offpolicy import is_on_policy, source_stats, tis_enabled
from trainer.ranks import all_reduce_sum, local_rank, parallel, world
from trainer.tracking import NoTracker, Tracker

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    history: list[dict[str, float]] = field(default_factory=list)  # one dict per optimizer step
    n_examples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    offpolicy: dict[str, dict[str, Any]] = field(default_factory=dict)  # per source version (trainer.offpolicy)
    world_size: int = 1  # processes that trained it (data-parallel)
    sharded: bool = False  # FSDP: the ranks held 1/world_size of the model each

    @property
    def summary(self) -> dict[str, float]:
        """Metrics worth a registry row: first and last step, and throughput."""
        if not self.history:
            return {}
        first, last = self.history[0], self.history[-1]
        out = {f"final_{k}": v for k, v in last.items() if k != "step"}
        out.update(first_loss=first["loss"], steps=float(len(self.history)), n_examples=float(self.n_examples))
        out.update(tokens=float(self.tokens), tokens_per_s=self.tokens / max(self.seconds, 1e-9))
        if self.world_size > 1:
            out.update(world_size=float(self.world_size))
        if self.sharded:
            out.update(fsdp=1.0)
        return out


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def bf16_autocast(precision: str, device: torch.device) -> bool:
    """Whether the forward pass runs under bf16 autocast: "auto" on CUDA, or "bf16" (CUDA only)."""
    if precision == "bf16" and device.type != "cuda":
        raise ConfigError(f'trainer.precision = "bf16" needs CUDA, and this run is on {device}: use "fp32" or "auto"')
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def shard_shares(algorithm: str, chunk: list[Example], mine: list[Example]) -> tuple[float, float]:
    """(tokens, loss): this rank's share of the micro-batch ``chunk``'s trained tokens, and of its loss's
    normalizer (its sequences for GRPO's per-sequence mean, else its trained tokens). 1 and 1 in one process."""
    tokens = sum(sum(ex.loss_mask) for ex in mine) / sum(sum(ex.loss_mask) for ex in chunk)
    return tokens, (len(mine) / len(chunk) if algorithm == "grpo" else tokens)


def resolve_base_model(cfg: TrainConfig) -> Path:
    """The base model's Hugging Face folder (``trainer.model_store.resolve_model``: the one rule)."""
    from trainer.model_store import resolve_model

    return resolve_model(cfg.base_model, Path(cfg.model_dir).expanduser())


def load_policy(cfg: TrainConfig, *, parent_path: str | None = None) -> tuple[torch.nn.Module, Any]:
    """Base model + a fresh LoRA adapter, or the parent's adapter (or full weights) to continue from."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.chat_template import apply

    base = resolve_base_model(cfg)
    # the template a full-weight version folder carries for vLLM: the base folder's, or model.chat_template
    tokenizer = apply(AutoTokenizer.from_pretrained(base), cfg.chat_template)
    if cfg.finetune == "full":
        return AutoModelForCausalLM.from_pretrained(parent_path or base, dtype=torch.float32), tokenizer
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model: a FutureWarning
        # in every run's log that tells the user nothing (checkpointing is `trainer.gradient_checkpointing`)
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        if parent_path:
            return PeftModel.from_pretrained(model, parent_path, is_trainable=True), tokenizer
        lora = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_targets),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora), tokenizer


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (``trainer.gradient_checkpointing``), non-reentrant:
    it works under DDP and FSDP2, and with frozen inputs (LoRA) without ``enable_input_require_grads``."""
    kwargs = {"use_reentrant": False}
    if (enable := getattr(model, "activation_checkpointing_enable", None)) is not None:  # transformers 5.x's name
        enable(activation_checkpointing_kwargs=kwargs)
    elif (enable := getattr(model, "gradient_checkpointing_enable", None)) is not None:
        enable(gradient_checkpointing_kwargs=kwargs)


def policy_loss(
    cfg: TrainConfig,
    logprobs: torch.Tensor,
    batch: Batch,
    ref_logprobs: torch.Tensor | None,
    *,
    baseline: float | None = None,
) -> LossOutput:
    """The configured algorithm's loss on one micro-batch (``baseline``: REINFORCE's, else the batch's own)."""
    if cfg.algorithm == "reinforce":
        return reinforce_loss(
            logprobs, batch.returns, batch.mask, baseline=baseline, seq_index=batch.seq_index, n_seqs=batch.n_seqs
        )
    kwargs: dict[str, Any] = dict(
        clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, ref_logprobs=ref_logprobs, kl_coef=cfg.kl_coef
    )
    if tis_enabled(cfg.tis_cap):
        kwargs.update(prox_logprobs=batch.prox_logprobs, tis_cap=cfg.tis_cap)
    if cfg.algorithm == "grpo":
        return grpo_loss(
            logprobs, batch.old_logprobs, batch.advantages, batch.mask, batch.seq_index, batch.n_seqs, **kwargs
        )
    return ppo_clip_loss(logprobs, batch.old_logprobs, batch.advantages, batch.mask, **kwargs)


def forward_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """(B, T-1) log-probabilities of each next token under ``model``."""
    return forward_logprobs_entropy(model, batch, entropy=False)[0]


def forward_logprobs_entropy(
    model: torch.nn.Module, batch: Batch, *, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T-1) log-probabilities under ``model`` and, from the same logits, the policy's mean entropy on the
    trained tokens (``trainer.losses.masked_entropy``; None when ``entropy`` is False)."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False
    )
    return token_logprobs(out.logits, batch.input_ids), masked_entropy(out.logits, batch.mask) if entropy else None


def batch_stats(examples: list[Example]) -> dict[str, float]:
    """The micro-batch's reward and advantage statistics, per sequence: what a tracker plots beside the loss.
    ``reward_*`` are of the return each row is trained with (its reward under the default identical credit).

    ``zero_adv_frac`` is the share of sequences with no advantage (a group whose samples all scored the
    same): near 1, the round learns nothing from its data. A step's values are its micro-batches' mean."""
    if not examples:
        return {}
    n = len(examples)
    rets = [ex.ret for ex in examples]
    advs = [ex.advantage for ex in examples]
    r_mean, a_mean = sum(rets) / n, sum(advs) / n
    return {
        "reward_mean": r_mean,
        "reward_std": math.sqrt(sum((r - r_mean) ** 2 for r in rets) / n),
        "adv_std": math.sqrt(sum((a - a_mean) ** 2 for a in advs) / n),
        "adv_abs_mean": sum(abs(a) for a in advs) / n,
        "zero_adv_frac": sum(1 for a in advs if abs(a) < 1e-8) / n,
    }


@torch.no_grad()
def proximal_logprobs(
    model: torch.nn.Module,
    examples: list[Example],
    *,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> None:
    """Set each example's ``prox_logprobs``: its response tokens' logprobs under ``model`` as it is now."""
    was_training = model.training
    model.eval()  # the policy itself, without dropout
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        batch = collate(chunk, pad_id=pad_id).to(device)  # one example per row, padded on the right
        with autocast():
            lp = forward_logprobs(model, batch).float().cpu()  # (B, T-1)
        for b, ex in enumerate(chunk):
            p, n = ex.n_prompt, len(ex.input_ids)
            ex.prox_logprobs = lp[b, p - 1 : n - 1].tolist()  # target t predicts token t+1
    model.train(was_training)


def shard_model(model: torch.nn.Module, device: torch.device, n_ranks: int) -> int:
    """FSDP2 in place: ``fully_shard`` on each decoder layer (the HF model's ``_no_split_modules``), then on
    the whole model (embeddings, norm, head: tied weights stay in one group). Returns the layers sharded.

    Each layer's weights are gathered just for its forward and backward, and its gradients reduce-scattered
    (averaged over the ranks, as DDP's all-reduce): each rank keeps 1/N of weights, gradients and AdamW state."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (n_ranks,))
    base_model = getattr(model, "get_base_model", None)  # under a peft wrapper
    hf = base_model() if base_model is not None else model
    blocks = set(getattr(hf, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return len(layers)


def _sharded_state(optimizer: torch.optim.Optimizer) -> None:
    """After loading a full (one-process) AdamW state into an FSDP optimizer: each moment cut to this rank's
    shard of its parameter. Every rank read the same file, so each slices its own part without communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for k, v in state.items():
                if isinstance(p, DTensor) and k != "step" and torch.is_tensor(v) and not isinstance(v, DTensor):
                    state[k] = distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)


def gather_to_rank0(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: torch.nn.Module | None
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The FSDP-trained weights and AdamW state, unsharded into rank 0's CPU copy ``keep`` and a plain AdamW
    over it: what ``trainer.checkpoints.save_checkpoint`` writes from one process. Every rank must call it
    (one all-gather per tensor, in the same order); the other ranks get their sharded model back."""
    from torch.distributed.tensor import DTensor

    def full(v: Any) -> Any:
        return v.full_tensor().cpu() if isinstance(v, DTensor) else v

    targets = dict(keep.named_parameters()) if keep is not None else {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:  # frozen ones (LoRA's base) never changed: keep has them
                value = full(p)
                if keep is not None:
                    targets[name].copy_(value)
    sd = optimizer.state_dict()  # keyed by the index of each trainable parameter, in model order
    state = {i: {k: full(v) for k, v in s.items()} for i, s in sd["state"].items()}
    if keep is None:
        return model, optimizer
    plain = torch.optim.AdamW([p for p in keep.parameters() if p.requires_grad])
    plain.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
    return keep, plain


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        disable=not enabled,
        transient=False,
    )


def train(
    cfg: TrainConfig,
    rows: pa.Table,
    *,
    model: torch.nn.Module | None = None,
    tokenizer: Any = None,
    parent_path: str | None = None,
    optimizer_state: dict[str, Any] | None = None,
    current_version: str | None = None,
    tracker: Tracker | None = None,
) -> TrainResult:
    """Run ``cfg.epochs`` over ``rows`` (a transitions table) and return the trained policy.

    ``current_version`` is the registry version the weights are (None: the base model); rows whose
    ``policy_version`` is another one are corrected as stale when ``cfg.tis_cap`` is set (the clipped
    losses; REINFORCE has no behaviour ratio to correct). ``tracker`` gets each optimizer step's metrics
    (rank 0's, summed over the ranks; ``trainer.tracking``); opening and closing it is the caller's.
    """
    # --- setup ------------------------------------------------------------------------------
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rank, n_ranks = world()  # (0, 1) without a process group
    tracker = tracker if tracker is not None and rank == 0 else NoTracker()
    device = pick_device(cfg.device)
    if n_ranks > 1 and device.type == "cuda":
        device = torch.device("cuda", local_rank())  # one GPU per rank
    use_bf16 = bf16_autocast(cfg.precision, device)

    def autocast() -> AbstractContextManager[Any]:
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else nullcontext()

    # --- model ------------------------------------------------------------------------------
    if model is None:
        model, tokenizer = load_policy(cfg, parent_path=parent_path)
    fsdp = parallel() == "fsdp"
    # FSDP: rank 0's unsharded CPU copy, which gather_to_rank0 fills with the trained weights at the end.
    keep = copy.deepcopy(model).cpu() if fsdp and rank == 0 else None
    model.to(device)
    model.train()
    if cfg.gradient_checkpointing:
        checkpoint_activations(model)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
    # KL reference: LoRA disables its adapter for a reference pass; a full fine-tune keeps a frozen copy.
    ref_model = None
    if cfg.kl_coef > 0 and not hasattr(model, "disable_adapter"):
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    # Data-parallel: DDP starts every rank from rank 0's weights and averages the gradients in backward;
    # FSDP shards the model in place (every rank loaded the same weights) and averages in reduce-scatter.
    ddp = model
    if fsdp:
        layers = shard_model(model, device, n_ranks)
        if rank == 0:
            log.info("FSDP: %d decoder layers and the rest of the model sharded over %d ranks", layers, n_ranks)
    elif n_ranks > 1:
        ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    # --- data -------------------------------------------------------------------------------
    examples = to_examples(rows, max_seq_len=cfg.max_seq_len)
    if not examples:
        raise TrainerError(f"none of the {rows.num_rows} transitions has a response token to train on")
    micro_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    # Stale rows: the policy at the start of the round is their proximal policy (trainer.losses).
    tis_cap = cfg.tis_cap if cfg.algorithm != "reinforce" else None
    if tis_enabled(tis_cap):
        stale = [ex for ex in examples if not is_on_policy(ex.policy_version, current_version)]
        if stale:
            proximal_logprobs(model, stale, batch_size=cfg.batch_size, pad_id=pad_id, device=device, autocast=autocast)
            if fsdp:  # FSDP keeps the root's weights gathered after a forward for the backward that would follow
                model.reshard()  # type: ignore[operator]
            log.info(
                "%d of %d transitions are off-policy: weighted by TIS (cap %g)", len(stale), len(examples), tis_cap
            )
    offpolicy = source_stats(examples, current_version=current_version, tis_cap=tis_cap)

    # --- optimizer --------------------------------------------------------------------------
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainerError("the model has no trainable parameters (a LoRA adapter loaded without is_trainable?)")
    optimizer = torch.optim.AdamW(
        params, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay
    )
    if optimizer_state is not None:  # resume: continue the parent's AdamW moments
        optimizer.load_state_dict(optimizer_state)
        for group in optimizer.param_groups:
            group["lr"] = cfg.learning_rate
        if fsdp:
            _sharded_state(optimizer)

    # --- loop -------------------------------------------------------------------------------
    result = TrainResult(
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        n_examples=len(examples),
        offpolicy=offpolicy,
        world_size=n_ranks,
        sharded=fsdp,
    )
    step = 0
    sums: dict[str, float] = {}
    n_micro = step_tokens = 0
    t_step = t_start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    with _progress(cfg.progress and rank == 0) as progress:
        bar = progress.add_task("", total=total_steps)
        for epoch in range(cfg.epochs):
            for i, chunk in enumerate(epoch_chunks(examples, batch_size=cfg.batch_size, seed=cfg.seed, epoch=epoch)):
                # This rank's shard of the micro-batch; a rank left without one trains a stand-in at share 0
                # (DDP needs every rank's backward).
                mine = chunk[rank::n_ranks]
                token_share, loss_share = shard_shares(cfg.algorithm, chunk, mine)
                batch = collate(mine or chunk[:1], pad_id=pad_id, pack=cfg.pack, max_seq_len=cfg.max_seq_len)
                batch = batch.to(device)
                # REINFORCE's baseline is the micro-batch's mean return: the whole one's, not this shard's.
                baseline = sum(ex.ret for ex in chunk) / len(chunk) if n_ranks > 1 else None
                ends_step = n_micro + 1 == cfg.grad_accum or i + 1 == micro_per_epoch
                # Gradients are averaged across ranks on the micro-batch that ends a step, not before.
                if fsdp:
                    model.set_requires_gradient_sync(ends_step)  # type: ignore[operator]
                with ddp.no_sync() if n_ranks > 1 and not fsdp and not ends_step else nullcontext():  # type: ignore[operator]
                    with autocast():
                        logprobs, entropy = forward_logprobs_entropy(ddp, batch)  # (B, T-1), scalar
                        ref_logprobs = None
                        if cfg.kl_coef > 0:
                            with torch.no_grad():
                                if ref_model is not None:
                                    ref_logprobs = forward_logprobs(ref_model, batch)
                                else:
                                    with model.disable_adapter():  # type: ignore[operator]
                                        ref_logprobs = forward_logprobs(model, batch)
                    out = policy_loss(cfg, logprobs, batch, ref_logprobs, baseline=baseline)
                    # DDP and FSDP average over ranks: times n_ranks, so the shares sum to the micro-batch's mean.
                    (out.loss * (loss_share * n_ranks) / cfg.grad_accum).backward()
                metrics = {k: float(v) for k, v in out.metrics.items()}
                metrics["entropy"] = float(entropy) if entropy is not None else 0.0
                # the whole micro-batch's sequences (every rank has them): each rank adds 1/n_ranks of them
                whole = batch_stats(chunk)
                metrics.update(whole)
                tokens = batch.n_tokens if mine else 0
                if n_ranks > 1:  # the micro-batch's metrics: each rank's part, weighted as its loss is
                    shares = {"loss": loss_share, "pg_loss": loss_share, "baseline": 1 / n_ranks}
                    shares.update({k: 1 / n_ranks for k in whole})
                    summed = all_reduce_sum(
                        [v * shares.get(k, token_share) for k, v in metrics.items()] + [tokens], device
                    )
                    metrics, tokens = dict(zip(metrics, summed[:-1], strict=True)), int(summed[-1])
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                n_micro += 1
                step_tokens += tokens
                if not ends_step:
                    continue
                # one optimizer step
                # FSDP: DTensor gradients; the norm is over the whole gradient (a replicated DTensor).
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                if fsdp:
                    grad_norm = grad_norm.full_tensor()  # type: ignore[attr-defined]
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                now = time.perf_counter()
                metrics = {k: v / n_micro for k, v in sums.items()}
                metrics.update(
                    step=float(step),
                    epoch=float(epoch),
                    grad_norm=float(grad_norm),
                    lr=cfg.learning_rate,
                    tokens=float(step_tokens),
                    tokens_per_s=step_tokens / max(now - t_step, 1e-9),
                )
                result.history.append(metrics)
                result.tokens += step_tokens
                tracker.log_metrics(step, {k: v for k, v in metrics.items() if k != "step"})
                if rank == 0:
                    log.info(
                        "step %d loss %.4f kl %.4f clip %.3f adv %.3f tok/s %.0f",
                        step,
                        metrics["loss"],
                        metrics["kl"],
                        metrics["clip_frac"],
                        metrics["adv_mean"],
                        metrics["tokens_per_s"],
                    )
                progress.update(
                    bar,
                    advance=1,
                    description=(
                        f"loss {metrics['loss']:.4f} kl {metrics['kl']:.4f} clip {metrics['clip_frac']:.2f} "
                        f"adv {metrics['adv_mean']:+.3f} {metrics['tokens_per_s']:.0f} tok/s"
                    ),
                )
                sums, n_micro, step_tokens, t_step = {}, 0, 0, time.perf_counter()
                if step >= total_steps:
                    break
            if step >= total_steps:
                break
    result.seconds = time.perf_counter() - t_start
    if fsdp:
        result.model, result.optimizer = gather_to_rank0(model, optimizer, keep)
    result.model.eval()
    return result
