"""The viewer's fixtures: one lake built by the real pipeline per session, apps over it with or without tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from schemas.config import Settings, load_settings
from schemas.lake import Lake
from tests.fixtures_vllm import MODEL_CACHE
from tests.viewer.lake import build_lake
from viewer.app import create_app

TENANT_TOKEN = "acme-secret-token"
OTHER_TENANT_TOKEN = "default-tenant-token"
OPERATOR_TOKEN = "operator-admin-token"


@pytest.fixture(scope="session")
def viewer_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    return build_lake(str(tmp_path_factory.mktemp("viewer") / "lake"))


def viewer_settings(state: Path, **overrides: Any) -> Settings:
    """Settings whose model cache holds the test tokenizer (smollm2, the gold step's)."""
    return load_settings(
        environ={},
        discover=False,
        overrides={"state": {"dir": str(state)}, "model": {"cache_dir": str(MODEL_CACHE)}, **overrides},
    )


@pytest.fixture(scope="session")
def client(viewer_lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    """An anonymous viewer (no tokens configured: every visitor is the operator)."""
    return TestClient(create_app(viewer_settings(tmp_path_factory.mktemp("state")), viewer_lake))


@pytest.fixture(scope="session")
def secured(viewer_lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> Callable[[], TestClient]:
    """A factory of fresh clients (no cookies) of a viewer with a tenant token per tenant and an operator token."""
    settings = viewer_settings(
        tmp_path_factory.mktemp("state"),
        collector={"auth_tokens": {TENANT_TOKEN: "acme", OTHER_TENANT_TOKEN: "default"}},
        gateway={"admin_token": OPERATOR_TOKEN},
    )
    app = create_app(settings, viewer_lake)
    return lambda: TestClient(app)
