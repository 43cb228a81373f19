"""Start, find and stop the processes `agentlake up` owns, through pid files in the state folder.

Each managed process gets ``<state>/run/<name>.json`` (pid, argv, start time, address) and a
log at ``<state>/logs/<name>.log``. Stopping signals only a pid whose recorded start time still
matches, so a recycled pid is never killed; the process group is signalled so children go too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from schemas.errors import AgentlakeError
from schemas.processes import process_alive


class StackError(AgentlakeError):
    """A part of the local stack failed to start, stop or answer."""


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    pid: int
    argv: list[str]
    create_time: float
    address: str
    log: str

    def is_running(self) -> bool:
        return process_alive(self.pid, self.create_time)


def run_dir(state_dir: Path) -> Path:
    return state_dir / "run"


def log_dir(state_dir: Path) -> Path:
    return state_dir / "logs"


def read(state_dir: Path, name: str) -> ManagedProcess | None:
    path = run_dir(state_dir) / f"{name}.json"
    if not path.exists():
        return None
    try:
        return ManagedProcess(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError):
        path.unlink(missing_ok=True)
        return None


def list_managed(state_dir: Path) -> list[ManagedProcess]:
    folder = run_dir(state_dir)
    if not folder.exists():
        return []
    found = (read(state_dir, p.stem) for p in sorted(folder.glob("*.json")))
    return [p for p in found if p is not None]


def start(
    state_dir: Path,
    name: str,
    argv: Sequence[str],
    *,
    address: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start ``argv`` in its own session, logging to the state folder, and record its pid file."""
    existing = read(state_dir, name)
    if existing is not None and existing.is_running():
        raise StackError(f"{name} is already running (pid {existing.pid}); run `agentlake down` first")
    run_dir(state_dir).mkdir(parents=True, exist_ok=True)
    log_dir(state_dir).mkdir(parents=True, exist_ok=True)
    log_path = log_dir(state_dir) / f"{name}.log"
    with open(log_path, "ab") as log:
        log.write(f"\n==> {time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    managed = ManagedProcess(
        name=name,
        pid=proc.pid,
        argv=list(argv),
        create_time=psutil.Process(proc.pid).create_time(),
        address=address,
        log=str(log_path),
    )
    (run_dir(state_dir) / f"{name}.json").write_text(json.dumps(asdict(managed), indent=2))
    return managed


def stop(state_dir: Path, name: str, *, timeout_s: float = 15.0) -> bool:
    """Stop a managed process and its group: SIGTERM, then SIGKILL after ``timeout_s``.

    Returns True when something was stopped. The pid file is removed either way.
    """
    managed = read(state_dir, name)
    pid_file = run_dir(state_dir) / f"{name}.json"
    if managed is None:
        return False
    stopped = False
    if managed.is_running():
        stopped = True
        try:
            proc = psutil.Process(managed.pid)
            group = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            group = []
        try:
            os.killpg(managed.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            for p in group:
                try:
                    p.terminate()
                except psutil.Error:
                    pass
        alive = wait_exited(group, timeout_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        wait_exited(alive, 5.0)
    pid_file.unlink(missing_ok=True)
    return stopped


def wait_exited(procs: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``procs`` to exit; return those still running.

    A zombie has exited: a child orphaned by the stop belongs to PID 1, which in a bare container may
    never reap it, and ``psutil.wait_procs`` alone then waits out the whole timeout and the SIGKILL's
    5 s for a process that holds nothing. Under a PID 1 that does not reap, measured: a process with
    one child took 20 s to stop, vLLM (API server, engine core, worker) 35 s, Dagster's daemon 11 s.
    """
    deadline = time.monotonic() + timeout_s
    alive = list(procs)
    while True:
        _, alive = psutil.wait_procs(alive, timeout=max(0.0, min(0.05, deadline - time.monotonic())))
        alive = [p for p in alive if not _exited(p)]
        if not alive or time.monotonic() >= deadline:
            return alive


def _exited(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
