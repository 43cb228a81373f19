"""Each loss against values worked out by hand (in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.losses import (
    grpo_loss,
    kl_k3,
    masked_mean,
    ppo_clip_loss,
    reinforce_loss,
    sequence_mean,
    token_logprobs,
)


def _lp(ratios: list[float]) -> torch.Tensor:
    """Current logprobs whose ratio to a behaviour logprob of 0 is exactly ``ratios``."""
    return torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)


def test_ppo_clip_ratios_clipping_and_mask() -> None:
    # token: ratio, advantage -> min(r*A, clip(r)*A); objective negated
    # 0: 1.5, +1 -> min(1.5, 1.2) = 1.2 (clipped)      -> -1.2
    # 1: 0.5, +1 -> min(0.5, 0.8) = 0.5                 -> -0.5
    # 2: 1.1, -1 -> min(-1.1, -1.1) = -1.1               -> +1.1
    # 3: 0.5, -2 -> min(-1.0, -1.6) = -1.6 (clipped)    -> +1.6
    # 4: 2.0, -1, masked out
    lp = _lp([1.5, 0.5, 1.1, 0.5, 2.0])
    old = torch.zeros_like(lp)
    adv = torch.tensor([[1.0, 1.0, -1.0, -2.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    out = ppo_clip_loss(lp, old, adv, mask, clip_eps=0.2)
    assert out.loss.item() == pytest.approx((-1.2 - 0.5 + 1.1 + 1.6) / 4)
    assert out.metrics["clip_frac"].item() == pytest.approx(2 / 4)
    assert out.metrics["ratio"].item() == pytest.approx((1.5 + 0.5 + 1.1 + 0.5) / 4)
    assert out.metrics["adv_mean"].item() == pytest.approx((1 + 1 - 1 - 2) / 4)
    out.loss.backward()
    # d(-r*A)/d(logp) = -r*A / n on unclipped tokens; 0 where clipped or masked.
    expected = torch.tensor([[0.0, -0.5 / 4, 1.1 / 4, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected)


def test_ppo_asymmetric_clip_high() -> None:
    # ratio 1.5, A=+1: with clip_eps_high=0.6 the upper bound is 1.6, so nothing is clipped.
    out = ppo_clip_loss(
        _lp([1.5]),
        torch.zeros(1, 1, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        clip_eps=0.2,
        clip_eps_high=0.6,
    )
    assert out.loss.item() == pytest.approx(-1.5)
    assert out.metrics["clip_frac"].item() == 0.0


def test_unknown_behaviour_logprobs_train_on_policy() -> None:
    # NaN behaviour logprob -> ratio 1, loss = -A, gradient = -A / n.
    lp = torch.tensor([[-0.7, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[float("nan"), float("nan")]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    out = ppo_clip_loss(lp, old, adv, torch.ones_like(adv))
    assert out.loss.item() == pytest.approx((-2.0 + 1.0) / 2)
    assert out.metrics["ratio"].item() == pytest.approx(1.0)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, 0.5]], dtype=torch.float64))


def test_kl_k3_by_hand_and_in_loss() -> None:
    # logp = log .5, ref = log .25: r = log .5; exp(r) - r - 1 = .5 + ln 2 - 1
    lp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    expected = 0.5 + math.log(2) - 1
    assert kl_k3(lp, ref).item() == pytest.approx(expected)
    assert kl_k3(lp, lp).item() == 0.0
    # In the loss: ratio 1 (old = logp), A = 0, so loss = kl_coef * kl.
    out = ppo_clip_loss(lp, lp.clone(), torch.zeros_like(lp), torch.ones_like(lp), ref_logprobs=ref, kl_coef=0.1)
    assert out.loss.item() == pytest.approx(0.1 * expected)
    assert out.metrics["kl"].item() == pytest.approx(expected)
    assert out.metrics["pg_loss"].item() == 0.0


def test_grpo_averages_per_sequence_then_over_sequences() -> None:
    # seq 0 has tokens with ratio 1 and A=+1, A=+1 (per-token -1, -1); seq 1 one token A=-4 (+4).
    # token mean: (-1 - 1 + 4) / 3 = 2/3; sequence mean: (mean(-1, -1) + 4) / 2 = 1.5
    lp = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-4.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    seq = torch.tensor([[0, 0], [1, -1]])
    assert grpo_loss(lp, lp, adv, mask, seq, 2).loss.item() == pytest.approx(1.5)
    assert ppo_clip_loss(lp, lp, adv, mask).loss.item() == pytest.approx(2 / 3)


def test_reinforce_with_baseline() -> None:
    # returns: seq 0 = 1.0 (two tokens), seq 1 = 0.0 (one token); baseline = mean over sequences = 0.5
    # advantages 0.5, 0.5, -0.5; logp -1, -2, -4 -> loss = mean(0.5, 1.0, -2.0) = -1/6
    lp = torch.tensor([[-1.0, -2.0], [-4.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ret = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    seq = torch.tensor([[0, 0], [1, -1]])
    out = reinforce_loss(lp, ret, mask, seq_index=seq, n_seqs=2)
    assert out.loss.item() == pytest.approx(-1 / 6)
    assert out.metrics["baseline"].item() == pytest.approx(0.5)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5 / 3, -0.5 / 3], [0.5 / 3, 0.0]], dtype=torch.float64))
    # An explicit baseline replaces the batch mean: b = 0 -> loss = mean(1, 2, 0) = 1
    assert reinforce_loss(lp, ret, mask, baseline=0.0).loss.item() == pytest.approx(1.0)


def test_masked_and_sequence_means_ignore_masked_tokens() -> None:
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    assert masked_mean(x, m).item() == 2.0
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert sequence_mean(x, m, torch.tensor([[0, 1, -1]]), 2).item() == 2.0


def test_token_logprobs_matches_log_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    expected = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, ids), expected, atol=1e-6)
