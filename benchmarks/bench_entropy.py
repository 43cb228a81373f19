"""What the per-step entropy metric costs beside the loss: `masked_entropy` vs `token_logprobs` on one logits tensor.

    .venv/bin/python benchmarks/bench_entropy.py [--batch 4] [--seq 128] [--vocab 49152] [--runs 5]

Random fp32 logits of SmolLM2's vocabulary by default, the back half of each row as response tokens (the
trained targets); prints the median of ``--runs`` timings of each. ``token_logprobs`` is the loss's own
pass over the same logits, so the ratio is the metric's share of that part of a step (a training step's
forward and backward cost far more).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from trainer.losses import masked_entropy, token_logprobs


def median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[runs // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(a.batch, a.seq, a.vocab)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    mask = torch.zeros(a.batch, a.seq - 1)
    mask[:, a.seq // 2 :] = 1
    lp = median_s(lambda: token_logprobs(logits, ids), a.runs)
    en = median_s(lambda: masked_entropy(logits, mask), a.runs)
    print(
        f"token_logprobs {lp * 1e3:.1f} ms, masked_entropy {en * 1e3:.1f} ms, ratio {en / lp:.2f} "
        f"(median of {a.runs}; B={a.batch} T={a.seq} V={a.vocab}, {int(mask.sum())} trained targets)"
    )


if __name__ == "__main__":
    main()
