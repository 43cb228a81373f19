"""Every tool finds the running local stack by itself (issue 14, finding 11).

`agentlake up` records the live addresses in ``<state>/stack.json``; settings loading falls back to
them when nothing explicit is set, a file whose processes are gone is ignored, the Dagster instance
needs no ``DAGSTER_STORAGE_DIR``, and the broker keeps its port across `down` and `up`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from agentlake.stack.ports import free_port
from schemas.config import load_settings
from schemas.config.stack_file import STACK_FILE_VERSION, stack_file
from tests.stacks import discard_stack

REPO = Path(__file__).resolve().parents[2]


def _write_stack(state: Path, procs: dict[str, psutil.Process], **settings: dict[str, object]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    doc = {
        "version": STACK_FILE_VERSION,
        "processes": {name: {"pid": p.pid, "create_time": p.create_time()} for name, p in procs.items()},
        "settings": settings,
    }
    stack_file(state).write_text(json.dumps(doc))


def _dead_process() -> psutil.Process:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    handle = psutil.Process(proc.pid)
    handle.create_time()  # cached while it runs
    proc.wait()
    return handle


# --- settings: the stack file, explicit settings, stale files ---------------------------------------


def test_settings_fall_back_to_the_running_stack(tmp_path: Path) -> None:
    state = tmp_path / "state"
    me = psutil.Process()
    _write_stack(
        state,
        {"broker": me, "collector": me},
        kafka={"bootstrap_servers": "127.0.0.1:19092"},
        lake={"root": str(tmp_path / "lake")},
        collector={"host": "127.0.0.1", "http_port": 14318, "grpc_port": 14317},
        vllm={"host": "127.0.0.1", "port": 18000},
    )
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)})
    assert s.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert not s.kafka.external, "the stack's own broker is not an external Kafka (`up` must not skip it)"
    assert s.lake.root == str(tmp_path / "lake")
    assert (s.collector.http_port, s.collector.grpc_port) == (14318, 14317)
    assert s.vllm.url == "http://127.0.0.1:18000"
    # An empty address means "the local broker": it is found too.
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(state), "KAFKA_BOOTSTRAP_SERVERS": ""})
    assert s.kafka.bootstrap_servers == "127.0.0.1:19092"
    # Opting out.
    assert load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)}, discover=False).kafka.bootstrap_servers == ""


def test_explicit_settings_win_over_the_stack_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    me = psutil.Process()
    _write_stack(
        state,
        {"broker": me},
        kafka={"bootstrap_servers": "127.0.0.1:19092"},
        lake={"root": str(tmp_path / "lake")},
        collector={"http_port": 14318},
    )
    cfg = tmp_path / "agentlake.toml"
    cfg.write_text(f'[state]\ndir = "{state}"\n[lake]\nroot = "{tmp_path / "mine"}"\n')
    s = load_settings(cfg, environ={"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092", "AGENTLAKE_COLLECTOR__HTTP_PORT": "5000"})
    assert s.kafka.bootstrap_servers == "kafka:9092" and s.kafka.external
    assert s.lake.root == str(tmp_path / "mine")
    assert s.collector.http_port == 5000
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)}, overrides={"kafka": {"bootstrap_servers": "k:1"}})
    assert s.kafka.bootstrap_servers == "k:1" and s.kafka.external


def test_a_stale_stack_file_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "state"
    dead = _dead_process()
    _write_stack(state, {"broker": dead, "collector": dead}, kafka={"bootstrap_servers": "127.0.0.1:19092"})
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)})
    assert s.kafka.bootstrap_servers == "" and s.lake.root == str(state / "lake")  # no store started here: folder

    # A recycled pid: the process runs, but it is not the one recorded (another start time).
    me = psutil.Process()
    doc = json.loads(stack_file(state).read_text())
    doc["processes"] = {"broker": {"pid": me.pid, "create_time": me.create_time() - 3600}}
    stack_file(state).write_text(json.dumps(doc))
    assert load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)}).kafka.bootstrap_servers == ""

    # The stack runs but its broker is gone: no Kafka address from it; its other addresses stay.
    _write_stack(
        state,
        {"broker": dead, "collector": me},
        kafka={"bootstrap_servers": "127.0.0.1:19092"},
        collector={"http_port": 14318},
    )
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)})
    assert s.kafka.bootstrap_servers == "" and s.collector.http_port == 14318

    stack_file(state).write_text("{not json")
    assert load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)}).kafka.bootstrap_servers == ""


def test_an_external_kafka_in_the_stack_file_stays_external(tmp_path: Path) -> None:
    """`up` with KAFKA_BOOTSTRAP_SERVERS starts no broker: later tools find that Kafka, still external."""
    state = tmp_path / "state"
    _write_stack(state, {"collector": psutil.Process()}, kafka={"bootstrap_servers": "kafka:9092"})
    s = load_settings(environ={"AGENTLAKE_STATE_DIR": str(state)})
    assert s.kafka.bootstrap_servers == "kafka:9092" and s.kafka.external


def test_dagster_yaml_needs_no_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster import DagsterInstance

    monkeypatch.delenv("DAGSTER_STORAGE_DIR", raising=False)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO / "dagster_home/dagster.yaml", home / "dagster.yaml")
    instance = DagsterInstance.from_config(str(home))
    try:
        assert Path(instance.root_directory) == home
        assert instance.get_runs() == []
    finally:
        instance.dispose()


@pytest.mark.slow  # `agentlake up` and restarts of a whole stack: ~19 s
def test_the_local_broker_keeps_its_port_across_restarts(tmp_path: Path) -> None:
    from agentlake.stack import local, processes

    settings = load_settings(environ={"AGENTLAKE_STATE_DIR": str(tmp_path / "state")})
    try:
        first = local.start_broker(settings)
        processes.stop(local.state_dir(settings), "broker")
        assert local.start_broker(settings) == first
        processes.stop(local.state_dir(settings), "broker")
        # Taken by someone else meanwhile: another port, remembered from then on.
        port = int(first.rsplit(":", 1)[1])
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            moved = local.start_broker(settings)
        assert moved != first and local.remembered_broker_port(settings) == int(moved.rsplit(":", 1)[1])
    finally:
        discard_stack(settings)  # the broker and the object store its log lives in


# --- the real stack: `agentlake up`, then the tools with a bare environment ------------------------


def _bare_env(**extra: str) -> dict[str, str]:
    """The environment of a new shell: no Kafka address, no Dagster storage, no agentlake settings."""
    drop = ("AGENTLAKE_", "KAFKA_", "DAGSTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(COLUMNS="200", AGENTLAKE_TRACKING__SERVER="false", **extra)  # MLflow's server: its own tests
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _agentlake(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "agentlake", *args], env)


def _send_spans(http_port: int, n: int) -> None:
    trace = uuid.uuid4().hex
    spans = [
        {
            "traceId": trace,
            "spanId": f"{i + 1:016x}",
            "name": "step",
            "startTimeUnixNano": str(time.time_ns()),
            "endTimeUnixNano": str(time.time_ns()),
        }
        for i in range(n)
    ]
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]}
    resp = httpx.post(f"http://127.0.0.1:{http_port}/v1/traces", json=body, timeout=30)
    assert resp.status_code == 200, resp.text


@pytest.mark.slow
def test_tools_find_the_running_stack(tmp_path: Path) -> None:
    state = tmp_path / "state"
    http_port = free_port()
    # Only `up` is told where things go; every later command gets the state folder and nothing else.
    up_env = _bare_env(
        AGENTLAKE_STATE_DIR=str(state),
        AGENTLAKE_LAKE=str(tmp_path / "lake"),
        AGENTLAKE_COLLECTOR__HTTP_PORT=str(http_port),
        AGENTLAKE_COLLECTOR__GRPC_PORT=str(free_port()),
    )
    env = _bare_env(AGENTLAKE_STATE_DIR=str(state))
    try:
        up = _agentlake(up_env, "up", "--no-dagster")
        assert up.returncode == 0, up.stdout + up.stderr
        found = load_settings(environ=env)
        bootstrap = found.kafka.bootstrap_servers
        assert bootstrap.startswith("127.0.0.1:") and not found.kafka.external
        assert found.lake.root == str(tmp_path / "lake") and found.collector.http_port == http_port

        status = _agentlake(env, "status")
        line = next(li for li in status.stdout.splitlines() if " collector " in li)
        assert "healthy" in line and str(http_port) in line, status.stdout

        _send_spans(http_port, 3)

        # `dagster asset materialize` as pipelines/README.md says, with DAGSTER_HOME an instance made
        # from dagster_home/dagster.yaml and no DAGSTER_STORAGE_DIR or KAFKA_BOOTSTRAP_SERVERS.
        home = tmp_path / "dagster_home"
        home.mkdir()
        shutil.copyfile(REPO / "dagster_home/dagster.yaml", home / "dagster.yaml")
        dg_env = {**env, "DAGSTER_HOME": str(home)}
        mat = _run(
            [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "pipelines", "--select", "spans"], dg_env
        )
        assert mat.returncode == 0, (mat.stdout + mat.stderr)[-4000:]
        import polars as pl

        assert pl.read_delta(str(tmp_path / "lake/spans")).height == 3

        replay = _agentlake(env, "replay", "--lake", str(tmp_path / "rebuilt"))
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert "no Kafka" not in replay.stdout + replay.stderr
        assert pl.read_delta(str(tmp_path / "rebuilt/spans")).height == 3

        # `agentlake model publish`: the publisher gets the stack's Kafka and its release event goes out.
        from serving.publish import Publisher
        from serving.releases import release_event, send_release_event

        pub = Publisher.from_settings(found)
        assert pub.kafka is not None and pub.kafka.bootstrap_servers == bootstrap
        row = {"version": "v0001", "base_model": "m", "kind": "lora", "path": "/x", "parent_version": None}
        assert send_release_event(pub.kafka, release_event(row, "published", served_name="p")) is None
        publish = _agentlake(env, "model", "publish")
        assert "no Kafka configured" not in publish.stdout + publish.stderr

        # `down` then `up`: the broker comes back on the same port, so clients holding it still work.
        assert _agentlake(env, "down").returncode == 0
        assert not stack_file(state).exists()
        assert load_settings(environ=env).kafka.bootstrap_servers == ""
        again = _agentlake(up_env, "up", "--no-dagster")
        assert again.returncode == 0, again.stdout + again.stderr
        assert load_settings(environ=env).kafka.bootstrap_servers == bootstrap
    finally:
        discard_stack(env)
    assert not stack_file(state).exists()
