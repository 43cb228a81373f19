"""Data-parallel rounds: ``agentlake train --nproc N`` and the ``policy`` asset with ``trainer.nproc = N``.

    launch()                      the caller's process (the CLI, the Dagster asset)
      -> python -m torch.distributed.run --standalone --nproc-per-node N -m trainer.distributed <run dir>
         every rank: a process group (gloo on CPU; NCCL with one GPU per rank, cuda:LOCAL_RANK)
           -> trainer.lines.train_lines: for each round, rank 0 reads the lake and decides (trainer.round),
              every rank trains its shard of each global batch (trainer.train: DDP, or FSDP with
              trainer.parallel = "fsdp"), rank 0 saves, stores, registers and writes the lineage, then
              writes the round results for launch()
      <- launch() returns those results (publishing stays the caller's, as with one process), or raises
         the failed rank's error

Rank 0 reads the rows and broadcasts them rather than every rank reading the pinned Delta version:
what a round trains on is not one table version but that version minus the ids in
``training_lineage``, minus the rows too stale for the registry's serving version, and those tables
can move between two ranks' reads (another trainer, a retention job). One reader makes one decision,
and the lake sees one reader. The broadcast is also the barrier after rank 0 fetched the parent's
folder, which the other ranks then load from the same disk (``--standalone``: one machine).

A rank that fails writes its error to ``error-<rank>.json`` in the run folder and exits non-zero;
torchrun then stops the other ranks, and ``launch`` raises ``TrainerError`` with the earliest error.
Collectives time out after ``trainer.ranks.TIMEOUT``, so a rank that hangs without exiting ends the job too.

``trainer.parallel`` (``agentlake train --parallel``) picks how the ranks hold the model: "ddp", a full
replica each, or "fsdp", 1/N of the weights, gradients and AdamW state each (FSDP2, for a model whose
training state does not fit one device); the losses and the saved checkpoint are the same either way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import TrainerError

if TYPE_CHECKING:
    from schemas.config import Settings
    from schemas.config.training import Parallel
    from trainer.round import RoundResult


REQUEST, RESULTS = "request.json", "results.json"  # files in the run folder launch() and the ranks share
FAIL_HOOK = "_AGENTLAKE_TEST_FAIL_RANK"  # tests only (tests/trainer/test_ddp.py): this rank raises at start

# --- a rank ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """One rank of ``launch``'s job: the rounds of ``train_lines`` with the request's settings."""
    from schemas.config import Settings
    from trainer.lines import train_lines
    from trainer.ranks import process_group
    from trainer.train import pick_device

    run = Path((argv if argv is not None else sys.argv[1:])[0])
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(  # only rank 0 tells what happens; the others speak up on errors
        level=logging.INFO if rank == 0 else logging.ERROR,
        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        request = json.loads((run / REQUEST).read_text())
        settings = Settings.model_validate(request["settings"])
        overrides: dict[str, Any] = request["overrides"]
        with process_group(pick_device(overrides.get("device", "auto")).type, settings.trainer.parallel):
            if os.environ.get(FAIL_HOOK) == str(rank):  # tests only: a rank that fails while its peers wait
                raise TrainerError(f"injected failure on rank {rank} ({FAIL_HOOK})")
            results = train_lines(settings, force=request["force"], **overrides)
            if rank == 0:
                (run / RESULTS).write_text(json.dumps([dataclasses.asdict(r) for r in results]))
    except BaseException as exc:
        error = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}"}
        (run / f"error-{rank}.json").write_text(json.dumps({**error, "traceback": traceback.format_exc()}))
        raise


# --- the caller's side ------------------------------------------------------------------------


def launch(
    settings: Settings,
    *,
    nproc: int,
    force: bool = False,
    overrides: dict[str, Any] | None = None,
    echo: Callable[[str], object] = print,
) -> list[RoundResult]:
    """Run ``train_lines(settings, force=force, **overrides)`` as ``nproc`` data-parallel processes.

    The job's output goes to ``echo`` line by line; a failed job raises ``TrainerError`` naming the rank
    that failed first and its error. The settings travel in a file only this user can read."""
    from trainer.round import RoundResult

    with tempfile.TemporaryDirectory(prefix="agentlake-train-") as tmp:
        run = Path(tmp)
        request = {"settings": settings.model_dump(mode="json"), "force": force, "overrides": overrides or {}}
        (run / REQUEST).write_text(json.dumps(request))
        (run / REQUEST).chmod(0o600)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += ["-m", "trainer.distributed", str(run)]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))  # the cores, shared
        root = str(Path(__file__).resolve().parents[1])  # the ranks import this checkout's trainer
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        last: deque[str] = deque(maxlen=20)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                last.append(line.rstrip())
                echo(line.rstrip())
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: take the job down with us
                proc.terminate()
                proc.wait()
        if code != 0:
            raise TrainerError(_failure(run, nproc, code, list(last)))
        return [RoundResult(**r) for r in json.loads((run / RESULTS).read_text())]


def train_rounds(
    settings: Settings,
    *,
    nproc: int | None = None,
    parallel: Parallel | None = None,
    force: bool = False,
    overrides: dict[str, Any] | None = None,
    echo: Callable[[str], object] = print,
) -> list[RoundResult]:
    """The rounds of ``train_lines``, in this process or, with ``nproc`` (default ``trainer.nproc``) > 1,
    as a data-parallel job (``launch``): the one choice the CLI and the `policy` asset both make.
    ``parallel`` (default ``trainer.parallel``): "ddp" or "fsdp"; one process is neither."""
    nproc = nproc or settings.trainer.nproc
    if parallel is not None:
        settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={"parallel": parallel})})
    if nproc > 1:
        return launch(settings, nproc=nproc, force=force, overrides=overrides, echo=echo)
    from trainer.lines import train_lines

    return train_lines(settings, force=force, **(overrides or {}))


def _failure(run: Path, nproc: int, code: int, last: list[str]) -> str:
    """The first rank's error (the others usually fail because it left), else torchrun's last lines."""
    errors = sorted((json.loads(p.read_text()) for p in run.glob("error-*.json")), key=lambda e: e["time"])
    if errors:
        first = errors[0]
        return f"training failed on rank {first['rank']} of {nproc}: {first['error']}"
    return f"torchrun exited with {code} and no rank reported an error; its last lines:\n" + "\n".join(last)


if __name__ == "__main__":
    main()
