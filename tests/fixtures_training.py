"""Fixtures of the trainer's and serving's tests (loaded through ``pytest_plugins``): a tiny random Llama
folder built once per session (torch loads only when a test asks for it), a temporary lake folder, and a
stand-in vLLM server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving.helpers import FakeVllm, running_fake_vllm


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.trainer.helpers import build_tiny_model_dir  # torch loads here

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture()
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    root.mkdir()
    return root


@pytest.fixture()
def vllm() -> Iterator[FakeVllm]:
    with running_fake_vllm() as server:
        yield server
