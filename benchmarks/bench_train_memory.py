"""Trainer memory: peak RSS and time of training steps with ``trainer.gradient_checkpointing`` on and off.

    .venv/bin/python benchmarks/bench_train_memory.py                   # 8 x 512 tokens, SmolLM2-135M LoRA
    .venv/bin/python benchmarks/bench_train_memory.py --batch-size 4 --seq-len 1024 --repeats 3

Each measurement is its own process (``ru_maxrss`` is a process's peak, never lowered), training ``--steps``
optimizer steps of ``--batch-size`` sequences of ``--seq-len`` random tokens (half prompt, half trained response)
through ``trainer.train.train``, as the `policy` asset does; the settings alternate between repeats (a shared
CPU drifts) and the table shows medians. The floor is the process with the model loaded and nothing trained.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_trainer import SMOLLM2, bench_config, load_base, synthetic_rows, with_lora  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def one(args: argparse.Namespace) -> dict[str, float]:
    """This process: load, then train with checkpointing ``args.one`` (``floor``: load only)."""
    from trainer.train import train

    base, _ = load_base(args.model)
    if args.one == "floor":
        return {"peak_mb": peak_mb(), "s_per_step": 0.0}
    ns = argparse.Namespace(
        batch_size=args.batch_size, steps=args.steps, prompt_len=args.seq_len // 2, response_len=args.seq_len // 2,
        model=args.model,
    )  # fmt: skip
    cfg = bench_config(ns).replace(gradient_checkpointing=args.one == "on")
    rows = synthetic_rows(args.steps * args.batch_size, ns.prompt_len, ns.response_len, 49152, seed=0)
    t0 = time.perf_counter()
    result = train(cfg, rows, model=with_lora(base, cfg, cfg.seed), tokenizer=None)
    # the whole train() call over its steps (its no-grad log-probability passes too): what a round pays per step
    return {"peak_mb": peak_mb(), "s_per_step": (time.perf_counter() - t0) / len(result.history)}


def measure(args: argparse.Namespace, setting: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--one", setting, "--model", str(args.model), "--steps", str(args.steps)]
    cmd += ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=SMOLLM2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--one", choices=["on", "off", "floor"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    runs: dict[str, list[dict[str, float]]] = {"floor": [], "off": [], "on": []}
    runs["floor"].append(measure(args, "floor"))
    for i in range(args.repeats):
        for setting in ("off", "on") if i % 2 == 0 else ("on", "off"):
            runs[setting].append(measure(args, setting))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("peak_mb", "s_per_step")} for k, v in runs.items()}
    table = Table(title=f"trainer memory: {args.batch_size} x {args.seq_len} tokens, {args.model.name} LoRA, "
                  f"medians of {args.repeats}")  # fmt: skip
    for col in ("gradient_checkpointing", "peak RSS MB", "above the loaded model MB", "s per step"):
        table.add_column(col, justify="right")
    floor = med["floor"]["peak_mb"]
    table.add_row("(model loaded, no step)", f"{floor:.0f}", "0", "")
    for setting in ("off", "on"):
        m = med[setting]
        table.add_row(setting, f"{m['peak_mb']:.0f}", f"{m['peak_mb'] - floor:.0f}", f"{m['s_per_step']:.1f}")
    off, on = med["off"], med["on"]
    table.add_row(
        "on / off",
        f"{on['peak_mb'] / off['peak_mb']:.2f}x",
        f"{(on['peak_mb'] - floor) / (off['peak_mb'] - floor):.2f}x",
        f"{on['s_per_step'] / off['s_per_step']:.2f}x",
    )
    Console().print(table)


if __name__ == "__main__":
    main()
