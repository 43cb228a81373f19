"""Session fixtures for the real model and a real vLLM server (loaded through ``pytest_plugins``).

The model cache and vLLM's venv live at the repository root (``.agentlake/models``,
``.venv-vllm``), so they are built once per machine, not once per run; the server gets a free
port and a temporary state folder. A server that cannot start fails the tests that asked for it,
with the tail of its log: it never turns into a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentlake.stack.vllm import start_vllm, stop_vllm
from schemas.config import Settings, load_settings
from trainer.model_store import pull_model

REPO = Path(__file__).resolve().parents[1]
MODEL_CACHE = REPO / ".agentlake" / "models"
VLLM_VENV = REPO / ".venv-vllm"


@dataclass(frozen=True)
class VllmServer:
    url: str
    served_name: str
    model_path: Path
    settings: Settings


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder, pulled (and converted) once per machine."""
    return pull_model("smollm2-135m", MODEL_CACHE).folder


@contextmanager
def _serving(model: Path, state_dir: Path) -> Iterator[VllmServer]:
    """A vLLM OpenAI server on ``model`` managed from ``state_dir``, with runtime LoRA loading on."""
    settings = load_settings(
        environ={},
        overrides={
            "state": {"dir": str(state_dir)},
            "model": {"cache_dir": str(MODEL_CACHE)},
            "vllm": {"venv": str(VLLM_VENV), "port": 0},
        },
    )
    process = start_vllm(settings, model)
    try:
        yield VllmServer(
            url=process.address,
            served_name=settings.model.base_served_name,
            model_path=model,
            settings=settings,
        )
    finally:
        stop_vllm(settings)


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A vLLM OpenAI server on the pulled model, with runtime LoRA loading on; stopped at the end."""
    with _serving(smollm2_dir, tmp_path_factory.mktemp("vllm-state")) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_server_b(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A second, independent server on the same model (its own port and process): another replica."""
    with _serving(smollm2_dir, tmp_path_factory.mktemp("vllm-state-b")) as server:
        yield server
