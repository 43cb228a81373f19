"""What a rank of a data-parallel job asks: its rank, rank 0's objects, sums over the ranks, its process group.

Without a process group (one process) every helper is the identity: no communication at all. The
job itself, launching it and each rank's entry point, is ``trainer.distributed``. The job's strategy
(``trainer.parallel``: "ddp" or "fsdp") is fixed with its process group and read by ``trainer.train``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from schemas.config.training import Parallel

TIMEOUT = timedelta(minutes=10)  # a collective waiting longer than this fails the job (the peers are gone)

T = TypeVar("T")

_parallel: Parallel = "ddp"  # this job's strategy; set by process_group


def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Whether this process reads and writes the lake, the registry and the artifacts, and logs."""
    return world()[0] == 0


def parallel() -> Parallel | None:
    """How the ranks split the model: "ddp" (every rank a full replica) or "fsdp" (sharded); None in one process."""
    return _parallel if world()[1] > 1 else None


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def share(obj: T | None) -> T:
    """Rank 0's ``obj`` on every rank (pickled through the process group); itself without one."""
    if world()[1] == 1:
        return obj  # type: ignore[return-value]
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Each value summed over the ranks, in one collective (float64, so small counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


@contextmanager
def process_group(device_type: str, strategy: Parallel = "ddp") -> Iterator[None]:
    """The process group of a torchrun rank (``WORLD_SIZE`` > 1): NCCL on CUDA, one GPU per rank; gloo on CPU.
    ``strategy``: how ``trainer.train`` splits the model over the ranks (``parallel``).

    Not torn down after an error: the process exits, and a teardown would wait on peers torchrun is stopping."""
    global _parallel
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f'trainer.parallel: expected "ddp" or "fsdp", got {strategy!r}')
    _parallel = strategy
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        yield
        return
    if device_type == "cuda":
        torch.cuda.set_device(local_rank())
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=TIMEOUT)
    yield
    dist.destroy_process_group()
