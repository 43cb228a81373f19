"""Truncated importance sampling in the clipped losses, against values worked out by hand (in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.losses import grpo_loss, ppo_clip_loss, tis_weights

NAN = float("nan")


def _t(values: list[float], *, grad: bool = False) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64, requires_grad=grad)


def test_tis_weights_cap_and_unknowns() -> None:
    # pi_old / pi_b: 3 -> capped to 2; 0.5 -> 0.5; unknown behaviour or proximal -> 1.
    w, capped = tis_weights(_t([math.log(3), math.log(0.5), 0.0, NAN]), _t([0.0, 0.0, NAN, 0.0]), 2.0)
    assert torch.allclose(w, _t([2.0, 0.5, 1.0, 1.0]))
    assert capped.tolist() == [[True, False, False, False]]


def test_ppo_clip_with_tis_by_hand() -> None:
    # behaviour logprob 0 everywhere; per token: pi_old/pi_b, pi/pi_old, A
    # 0: 3   -> w = 2 (capped), r = 1,   A = +1 -> -2 * min(1, 1)         = -2.0
    # 1: 0.5 -> w = 0.5,        r = 1.5, A = +1 -> -0.5 * min(1.5, 1.2)   = -0.6 (clipped: no gradient)
    # 2: 1.5 -> w = 1.5,        r = 0.9, A = -1 -> -1.5 * min(-0.9, -0.9) = +1.35
    # 3: on-policy (no proximal logprob) -> w = 1, r = pi/pi_b = 1.1, A = +1 -> -1.1
    # 4: masked out (ratio 10 would be capped, but does not count)
    prox = _t([math.log(3), math.log(0.5), math.log(1.5), NAN, math.log(10)])
    ratio_to_old = [1.0, 1.5, 0.9, 1.1, 1.0]
    lp = torch.tensor(
        [
            [
                (p if not math.isnan(p) else 0.0) + math.log(r)
                for p, r in zip(prox[0].tolist(), ratio_to_old, strict=True)
            ]
        ],
        dtype=torch.float64,
        requires_grad=True,
    )
    beh = torch.zeros_like(prox)
    adv = _t([1.0, 1.0, -1.0, 1.0, 1.0])
    mask = _t([1.0, 1.0, 1.0, 1.0, 0.0])
    out = ppo_clip_loss(lp, beh, adv, mask, clip_eps=0.2, prox_logprobs=prox, tis_cap=2.0)
    assert out.loss.item() == pytest.approx((-2.0 - 0.6 + 1.35 - 1.1) / 4)
    assert out.metrics["tis_weight"].item() == pytest.approx((2 + 0.5 + 1.5 + 1) / 4)
    assert out.metrics["tis_clip_frac"].item() == pytest.approx(1 / 4)
    assert out.metrics["ratio"].item() == pytest.approx((1.0 + 1.5 + 0.9 + 1.1) / 4)  # pi / pi_old
    out.loss.backward()
    # d(-w r A)/d(logp) = -w r A / n where unclipped; 0 where clipped or masked.
    expected = _t([-2.0 / 4, 0.0, 1.35 / 4, -1.1 / 4, 0.0])
    assert torch.allclose(lp.grad, expected)

    # The same tokens without TIS: the ratio is to the behaviour policy, unweighted.
    plain = ppo_clip_loss(lp.detach(), beh, adv, mask, clip_eps=0.2)
    assert plain.loss.item() != pytest.approx(out.loss.item())


def test_on_policy_tokens_give_exactly_the_plain_loss() -> None:
    torch.manual_seed(0)
    lp = torch.randn(2, 6, dtype=torch.float64).clamp(max=-0.1)
    beh = (lp + 0.3 * torch.randn_like(lp)).clamp(max=-0.05)
    beh[0, 2] = NAN  # an unknown behaviour logprob stays on-policy too
    adv = torch.randn(2, 6, dtype=torch.float64)
    mask = (torch.rand(2, 6) > 0.2).double()
    seq = torch.tensor([[0, 0, 0, 1, 1, 1], [2, 2, 2, 3, 3, 3]])
    for tis in ({}, {"tis_cap": 2.0}, {"tis_cap": 2.0, "prox_logprobs": torch.full_like(lp, NAN)}):
        a, b = lp.clone().requires_grad_(), lp.clone().requires_grad_()
        plain = grpo_loss(a, beh, adv, mask, seq, 4)
        weighted = grpo_loss(b, beh, adv, mask, seq, 4, **tis)
        plain.loss.backward()
        weighted.loss.backward()
        assert torch.equal(plain.loss, weighted.loss) and torch.equal(a.grad, b.grad)
        assert weighted.metrics["tis_weight"].item() == 1.0


def test_grpo_weights_each_sequence_before_averaging() -> None:
    # seq 0: one token, w = 2 (ratio 4 capped), r = 1, A = 1 -> -2
    # seq 1: two tokens, w = 0.5 and 1 (on-policy), r = 1, A = -1 -> mean(+0.5, +1) = 0.75
    prox = _t([math.log(4), math.log(0.5), NAN])
    beh = _t([0.0, 0.0, -0.7])
    lp = torch.where(torch.isnan(prox), beh, prox).clone().requires_grad_()
    out = grpo_loss(
        lp, beh, _t([1.0, -1.0, -1.0]), _t([1.0, 1.0, 1.0]), torch.tensor([[0, 1, 1]]), 2,
        prox_logprobs=prox, tis_cap=2.0,
    )  # fmt: skip
    assert out.loss.item() == pytest.approx((-2.0 + 0.75) / 2)
