"""Trainer fixtures: a tiny random Llama folder (built once per session) and a temporary lake."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import build_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture()
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    root.mkdir()
    return root
