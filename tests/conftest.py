"""Shared fixtures: a real Kafka-protocol broker (local Tansu unless KAFKA_BOOTSTRAP_SERVERS is set)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from agentlake.stack.broker import LocalBroker
from schemas.config import KafkaSettings, Settings, load_settings
from tests.objectstore import ObjectStore
from tests.topics import fresh_kafka

pytest_plugins = ["tests.fixtures_vllm", "tests.fixtures_training", "tests.browser"]


def _free_disk() -> str:
    where = tempfile.gettempdir()
    return f"{shutil.disk_usage(where).free / 2**30:.1f} GiB free under {where}"


def pytest_report_header() -> str:
    """The disk left at the start: a run that fills a small disk fails far from the cause."""
    return f"disk: {_free_disk()}"


# The CLI's rich console reads its width once, at import; a pipe (CI, an xdist worker) would give it 80
# columns and the tests that read its tables and paths would find them wrapped or cut
os.environ.setdefault("COLUMNS", "200")

SHARED_SERVERS_GROUP = "shared-servers"
"""The tests that run vLLM or a whole stack (the stack's ports are fixed, a vLLM takes GBs and the cores):
under ``pytest -n N --dist loadgroup`` they run on one worker, in order, so each session server starts once
and no two of them run at once; every other test runs beside them on the other workers."""
VLLM_FIXTURES = {"vllm_server", "vllm_server_b"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the test's id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        vllm = item.get_closest_marker("vllm") or VLLM_FIXTURES & set(getattr(item, "fixturenames", ()))
        if vllm or item.path.parent.name in {"e2e", "stack"}:
            item.add_marker(pytest.mark.xdist_group(SHARED_SERVERS_GROUP))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"disk at the end: {_free_disk()}")


@pytest.fixture(scope="session", autouse=True)
def _own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep tests away from the checkout's ``.agentlake``: a stack a user ran there (`make demo`),
    running or stopped, must not become the default lake of a test's child process."""
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("AGENTLAKE_STATE_DIR"):
            mp.setenv("AGENTLAKE_STATE_DIR", str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real broker for the whole session."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        yield external
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with LocalBroker(log_path=log) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """A real S3 object store (local SeaweedFS) for the whole session; lakes on it via ``lake_root()``."""
    store = ObjectStore(tmp_path_factory.mktemp("objectstore"))
    try:
        yield store
    finally:
        store.close()


@pytest.fixture()
def kafka_settings(kafka_bootstrap: str) -> KafkaSettings:
    """Kafka settings with topics unique to this test, already created."""
    return fresh_kafka(kafka_bootstrap)


@pytest.fixture()
def settings(tmp_path, kafka_settings: KafkaSettings) -> Settings:
    """Full settings pointing at a temporary lake and state folder and the test broker."""
    return load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "lake": {"root": str(tmp_path / "lake")},
            "kafka": kafka_settings.model_dump(),
        },
    )
