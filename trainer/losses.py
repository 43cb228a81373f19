"""Policy-gradient losses, pure torch, over target-aligned (B, T) tensors.

Every loss takes per-token log-probabilities of the current policy, a float ``mask`` of the
tokens to train (1 = trained), and returns the scalar loss plus detached metrics.

- ``ppo_clip_loss``: PPO-clip with the token-level importance ratio ``exp(logp - logp_behaviour)``
  to the logprobs stored with the transition (vLLM's), averaged over all trained tokens.
- ``grpo_loss``: the same clipped objective averaged per sequence, then over sequences
  (Shao et al. 2024); advantages arrive group-normalized from the transitions table.
- ``reinforce_loss``: ``-(R - b) * logp`` with a baseline ``b`` (the batch's mean return).

Both clipped losses add ``kl_coef * KL`` to a reference policy with the k3 estimator
``exp(r) - r - 1``, ``r = logp_ref - logp`` (unbiased, always >= 0; Schulman 2020).
Where the behaviour logprob is unknown (NaN) the ratio is 1: that token is trained on-policy.

Stale data (sampled by an older policy version, ``trainer.offpolicy``) uses the decoupled clipped
objective with truncated importance sampling (TIS). Per token, with ``pi_b`` the behaviour policy
(the logprobs stored with the transition), ``pi_old`` the proximal policy (the weights at the start
of the round, ``prox_logprobs``, no grad) and ``pi`` the policy being trained:

    r = pi / pi_old                    the clip term's ratio, clipped to [1 - eps, 1 + eps_high]
    w = min(pi_old / pi_b, C)          the TIS weight, a constant (C = ``tis_cap``)
    loss_t = -w * min(r * A, clip(r) * A)  (+ kl_coef * KL_t, not weighted)

On-policy tokens have no ``prox_logprobs`` (NaN): ``pi_old`` is ``pi_b`` itself, so ``w = 1`` and
``r = pi / pi_b``, exactly the plain loss. Tokens without behaviour logprobs cannot be corrected:
``w = 1``, and ``r`` is taken to ``pi_old`` (or to ``pi`` itself, ratio 1, when that is unknown too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, Unpack

import torch
import torch.nn.functional as F


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    metrics: dict[str, torch.Tensor]  # scalars, detached


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t+1] | prefix) for each t: (B, T, V), (B, T) -> (B, T-1), in fp32."""
    B, T, V = logits.shape
    # Every position's target, the last one ignored: the logits are read as they are, where slicing off the
    # last position first would copy all of them (B x T x V, 0.8 GB for 8 x 512 tokens of a 49k vocabulary).
    targets = F.pad(input_ids[:, 1:], (0, 1), value=-100)
    nll = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1), reduction="none", ignore_index=-100)
    return -nll.view(B, T)[:, :-1].contiguous()


ENTROPY_CHUNK = 256  # rows of logits softmaxed at once by masked_entropy (256 x 150k vocab x fp32: 150 MB)
ENTROPY_MAX_ROWS = 64  # response positions masked_entropy averages over per micro-batch, at most


@torch.no_grad()
def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the next-token distribution over the trained targets: (B, T, V), (B, T-1) -> scalar.

    Only the masked positions' rows of the logits are softmaxed (the response tokens, not the prompt), at most
    ``ENTROPY_MAX_ROWS`` of them evenly spaced (beyond that the mean is an estimate, and the cost stays a
    fraction of the loss's), in chunks of ``ENTROPY_CHUNK`` rows so the fp32 copies stay small beside a large
    vocabulary's logits. A falling entropy is the first sign of exploration collapse."""
    trained = mask.bool()
    if not bool(trained.any()):
        return mask.sum() * 0.0
    b, t = trained.nonzero(as_tuple=True)  # the trained targets' positions (target t: logits row t)
    if b.shape[0] > ENTROPY_MAX_ROWS:  # an estimate: evenly spaced response positions, the cost capped
        pick = torch.linspace(0, b.shape[0] - 1, ENTROPY_MAX_ROWS, device=b.device).long()
        b, t = b[pick], t[pick]
    rows = logits[b, t]  # (K, V), in the logits' dtype: only these rows are copied
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for i in range(0, rows.shape[0], ENTROPY_CHUNK):
        logp = torch.log_softmax(rows[i : i + ENTROPY_CHUNK].float(), dim=-1)
        total += -(logp.exp() * logp).sum()
    return total / rows.shape[0]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the tokens where ``mask`` is 1 (0 when there are none)."""
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor, seq_index: torch.Tensor, n_seqs: int) -> torch.Tensor:
    """Mean over each sequence's masked tokens, then over sequences, so long answers weigh no more."""
    idx = seq_index.clamp_min(0).reshape(-1)
    w = mask.reshape(-1)
    sums = torch.zeros(n_seqs, dtype=x.dtype, device=x.device).index_add(0, idx, (x * mask).reshape(-1))
    counts = torch.zeros(n_seqs, dtype=w.dtype, device=x.device).index_add(0, idx, w)
    has = counts > 0
    if not bool(has.any()):
        return sums.sum() * 0.0
    return (sums[has] / counts[has]).mean()


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(r) - r - 1 with r = ref - logp."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


class ClipOptions(TypedDict, total=False):
    """The keyword options both clipped losses take; their defaults live in ``_clipped`` alone."""

    clip_eps: float  # default 0.2
    clip_eps_high: float | None  # default None: the same as clip_eps
    ref_logprobs: torch.Tensor | None  # default None: no KL term
    kl_coef: float  # default 0.0
    prox_logprobs: torch.Tensor | None  # default None: every token on-policy (pi_old = pi_b)
    tis_cap: float | None  # default None: no importance weight (w = 1)


Aggregate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (per-token values, mask) -> scalar


def tis_weights(
    prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, capped): ``min(exp(prox - behaviour), cap)`` per token, 1 where either is NaN; which were capped."""
    log_ratio = prox_logprobs - behaviour_logprobs
    known = ~torch.isnan(log_ratio)
    ratio = torch.exp(torch.where(known, log_ratio, torch.zeros_like(log_ratio)))
    return torch.clamp(ratio, max=cap).detach(), (known & (ratio > cap))


def _clipped(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: Aggregate,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    prox_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> LossOutput:
    """The clipped objective both losses share; ``agg`` is how they differ (per token or per sequence)."""
    prox = (
        old_logprobs if prox_logprobs is None else torch.where(torch.isnan(prox_logprobs), old_logprobs, prox_logprobs)
    )
    old = torch.where(torch.isnan(prox), logprobs.detach(), prox)  # pi_old; unknown: pi itself
    ratio = torch.exp(logprobs - old)  # (B, T)
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + hi) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    weight, capped = torch.ones_like(per_token), torch.zeros_like(per_token, dtype=torch.bool)
    if tis_cap:
        weight, capped = tis_weights(prox, old_logprobs, tis_cap)
        per_token = weight * per_token
    pg_per_token = per_token
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        kl = kl_k3(logprobs, ref_logprobs)
        if kl_coef:
            per_token = per_token + kl_coef * kl

    loss = agg(per_token, mask)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "pg_loss": agg(pg_per_token, mask).detach(),
            "kl": masked_mean(kl, mask),
            "clip_frac": masked_mean((clipped < unclipped).float(), mask),  # tokens whose gradient was cut
            "ratio": masked_mean(ratio, mask),
            "adv_mean": masked_mean(advantages, mask),
            "tis_weight": masked_mean(weight, mask),
            "tis_clip_frac": masked_mean(capped.to(mask.dtype), mask),  # tokens whose weight was cut to C
        }
    return LossOutput(loss, metrics)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **clip: Unpack[ClipOptions],
) -> LossOutput:
    """PPO-clip averaged over every trained token of the batch."""
    return _clipped(logprobs, old_logprobs, advantages, mask, masked_mean, **clip)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq_index: torch.Tensor,
    n_seqs: int,
    **clip: Unpack[ClipOptions],
) -> LossOutput:
    """GRPO: the clipped objective averaged within each sequence, then across sequences."""

    def per_sequence(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return sequence_mean(x, m, seq_index, n_seqs or int(seq_index.max()) + 1)

    return _clipped(logprobs, old_logprobs, advantages, mask, per_sequence, **clip)


def reinforce_loss(
    logprobs: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    baseline: float | torch.Tensor | None = None,
    seq_index: torch.Tensor | None = None,
    n_seqs: int | None = None,
) -> LossOutput:
    """REINFORCE: -(R - b) * logp per trained token; ``b`` defaults to the mean return per sequence."""
    if baseline is None:
        if seq_index is not None:
            baseline = sequence_mean(returns, mask, seq_index, n_seqs or int(seq_index.max()) + 1)
        else:
            baseline = masked_mean(returns, mask)
    adv = (returns - baseline).detach()
    loss = masked_mean(-adv * logprobs, mask)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "pg_loss": loss.detach(),
            "kl": torch.zeros((), device=logprobs.device),
            "clip_frac": torch.zeros((), device=logprobs.device),
            "ratio": torch.ones((), device=logprobs.device),
            "adv_mean": masked_mean(adv, mask),
            "baseline": torch.as_tensor(baseline, dtype=torch.float32).detach(),
        }
    return LossOutput(loss, metrics)
