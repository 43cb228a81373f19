"""The release bus without vLLM: which commands a loader acts on, what it acks, what the publisher makes of it.

A real broker (the session's Tansu) carries commands and acks, and a real lake folder holds the registry
and ``served_versions``. Where a loader needs its vLLM to fail, it points at a port nobody listens on: a
real refused connection, not a mock. The loaders against real vLLM servers are in test_release_bus.py.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlake.stack.ports import free_port
from schemas.config import Settings
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from serving.errors import PublishError
from serving.loader import Loader, Served, build_ack, latest_releases, targets_me
from serving.publish import Publisher
from serving.release_bus import release
from serving.releases import release_command, release_event, send_release_event, unload_command
from serving.served import record_acks, served_now
from tests.collectors.helpers import wait_until
from tests.serving.helpers import register_stored
from trainer.artifacts import store_version
from trainer.registry import Registry


def _row(version: str, *, uri: str = "s3://bucket/lake/models/x", sha: str = "a" * 64) -> dict[str, Any]:
    return {
        "version": version,
        "base_model": "base",
        "kind": "lora",
        "path": f"/trainer/{version}",
        "parent_version": None,
        "artifact_uri": uri,
        "manifest_sha256": sha,
    }


def _loader(settings: Settings, replica: str, tmp_path: Path) -> Loader:
    dead_vllm = f"http://127.0.0.1:{free_port()}"  # nobody listens: every vLLM call is refused
    return Loader(kafka=settings.kafka, replica=replica, vllm_url=dead_vllm, cache_dir=tmp_path / replica, timeout_s=5)


@pytest.fixture()
def running(settings: Settings, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """Loader ``r1`` following the settings' topics in a thread; the list collects the acks it sends."""
    acks: list[dict[str, Any]] = []
    stop = threading.Event()
    loader = _loader(settings, "r1", tmp_path)
    thread = threading.Thread(target=loader.run, args=(stop,), kwargs={"on_ack": acks.append})
    thread.start()
    yield acks
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_loader_acts_on_release_commands_for_it_only() -> None:
    cmd = release_command(_row("v1"), served_name="p")
    assert targets_me(cmd, "r1")
    assert targets_me({**cmd, "targets": ["r1", "r2"]}, "r1")
    assert not targets_me({**cmd, "targets": ["r2"]}, "r1")
    assert not targets_me(release_event(_row("v1"), "published", served_name="p"), "r1")  # an announcement


@pytest.mark.kafka
def test_on_start_the_latest_command_per_served_name_is_applied(settings: Settings, tmp_path: Path) -> None:
    from kafka import KafkaConsumer

    sent = [
        release_command(_row("v1"), served_name="p"),
        release_command(_row("v2"), served_name="p"),
        release_event(_row("v2"), "published", served_name="p"),  # announcements never count
        release_command(_row("v3"), served_name="p", targets=["r2"]),  # another replica's
        release_command(_row("v1"), served_name="p-planner"),
    ]
    for event in sent:
        assert send_release_event(settings.kafka, event) is None
    loader = _loader(settings, "r1", tmp_path)
    consumer = KafkaConsumer(**kafka_python_config(settings.kafka, role="consumer"), enable_auto_commit=False)
    try:
        loader._assign(consumer, threading.Event())
        events = loader._catch_up(consumer)
    finally:
        consumer.close()
    assert len(events) == len(sent)
    latest = latest_releases(events, "r1")
    assert {name: e["version"] for name, e in latest.items()} == {"p": "v2", "p-planner": "v1"}
    assert latest["p"]["release_id"] == sent[1]["release_id"]
    assert latest_releases(events, "r2")["p"]["version"] == "v3"


def test_an_ack_says_what_was_asked_and_what_is_served() -> None:
    cmd = release_command(_row("v3", sha="c" * 64), served_name="p")
    served = Served("/cache/bbbb/v2", "v2", "b" * 64)
    ack = build_ack(cmd, "r1", error="v3: adapter_model.safetensors does not match", served=served, seconds=0.25)
    assert (ack["release_id"], ack["replica"], ack["version"], ack["manifest_sha256"]) == (
        cmd["release_id"],
        "r1",
        "v3",
        "c" * 64,
    )
    assert not ack["ok"] and "does not match" in ack["error"]
    assert (ack["serving_version"], ack["serving_sha256"]) == ("v2", "b" * 64)
    assert build_ack(cmd, "r1", error=None, served=served, seconds=0.1)["ok"]


@pytest.mark.slow  # waits out a silent replica's ack timeout: ~7 s
@pytest.mark.kafka
def test_a_failing_replica_acks_the_error_and_a_silent_one_is_named(
    settings: Settings, running: list[dict[str, Any]]
) -> None:
    cmd = release_command(_row("v1"), served_name="p")
    outcome = release(settings.kafka, cmd, ["r1", "ghost"], timeout_s=6)
    assert outcome.silent == ["ghost"]
    ack = outcome.acks["r1"]
    assert not ack["ok"] and "unreachable" in ack["error"] and ack["serving_version"] is None
    errors = outcome.errors()
    assert "unreachable" in errors["r1"] and "no ack within 6s" in errors["ghost"]
    # the loader is still there for the next command
    # release() returns at the ack: the long timeout costs nothing here and rides out a loaded machine (CI's
    # other worker training beside a vLLM once kept this ack past 15 s)
    again = release(settings.kafka, release_command(_row("v2"), served_name="p"), ["r1"], timeout_s=90)
    sent = [a["version"] for a in running]
    assert "r1" in again.acks, f"no ack from r1 for v2 within 90 s; the loader had sent acks for {sent}"
    # the loader calls on_ack after the broker took the ack, so the waiter may read the ack before the hook ran
    wait_until(lambda: len(running) >= 2, 10, "the loader's on_ack hook for v2")
    assert again.acks["r1"]["version"] == "v2" and [a["version"] for a in running] == ["v1", "v2"]


@pytest.mark.slow  # three replicas' loaders through a real broker: ~15 s
@pytest.mark.kafka
def test_publish_through_the_bus_records_every_replicas_error(
    settings: Settings, running: list[dict[str, Any]], tmp_path: Path
) -> None:
    folder = tmp_path / "lake" / "models" / "v0001"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    reg = Registry(Lake(str(tmp_path / "lake")))
    register_stored(reg, folder, 1)
    pub = Publisher(
        registry=reg, vllm_url="", served_name="p", kafka=settings.kafka, replicas=("r1", "r2"), ack_timeout_s=6
    )
    with pytest.raises(PublishError, match="v0001 was not published: replica r1: .*unreachable.*replica r2: no ack"):
        pub.publish("v0001")
    row = reg.get("v0001")
    assert row["publish_status"] == "failed"
    assert "replica r1:" in row["publish_error"] and "replica r2: no ack within 6s" in row["publish_error"]
    (now,) = served_now(reg.lake)  # r1's acks were recorded; r2 said nothing
    assert (now["replica"], now["version"], now["ok"], now["serving_version"]) == ("r1", "v0001", False, None)
    # nothing of the line served before: the replicas that took v0001 must drop it, so an unload follows
    assert [(c["status"], c["version"], c["targets"]) for c in _commands(settings)] == [
        ("release", "v0001", []),
        ("unload", "v0001", []),
    ]
    assert [a["version"] for a in running] == ["v0001", "v0001"]
    assert running[0]["release_id"] != running[1]["release_id"]


def test_served_now_is_the_latest_ack_per_replica_and_name(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def ack(replica: str, name: str, version: str, minute: int) -> dict[str, Any]:
        cmd = release_command(_row(version), served_name=name)
        served = Served(f"/c/{version}", version, "a" * 64)
        built = build_ack(cmd, replica, error=None, served=served, seconds=0.1)
        return {**built, "timestamp": t0.replace(minute=minute)}

    assert served_now(lake) == []
    record_acks(lake, [ack("r1", "p", "v1", 1), ack("r2", "p", "v1", 1)])
    record_acks(lake, [ack("r1", "p", "v2", 3), ack("r1", "p-planner", "v7", 2)])
    now = [(r["replica"], r["served_name"], r["serving_version"]) for r in served_now(lake)]
    assert now == [("r1", "p", "v2"), ("r1", "p-planner", "v7"), ("r2", "p", "v1")]


def test_the_cli_shows_what_each_replica_serves_and_a_loader_needs_a_name(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentlake.cli import app

    lake = tmp_path / "lake"
    config = tmp_path / "agentlake.toml"
    # a vLLM port nothing listens on: not the machine's own vLLM on 8000, which `model served` would list
    config.write_text(f'[lake]\nroot = "{lake}"\n[state]\ndir = "{tmp_path / "state"}"\n[vllm]\nport = {free_port()}\n')
    runner = CliRunner()
    empty = runner.invoke(app, ["model", "served", "--config", str(config)])
    assert empty.exit_code == 0 and "no replica has acked" in empty.output
    cmd = release_command(_row("v0002"), served_name="agentlake-policy")
    served = Served("/cache/abcd/v0002", "v0002", "f" * 64)
    record_acks(Lake(str(lake)), [build_ack(cmd, "gpu-a", error=None, served=served, seconds=0.3)])
    shown = runner.invoke(app, ["model", "served", "--config", str(config)], env={"COLUMNS": "200"})  # one row a line
    assert shown.exit_code == 0 and "gpu-a" in shown.output and "v0002" in shown.output and "f" * 12 in shown.output
    nameless = runner.invoke(app, ["loader", "--config", str(config)])
    assert nameless.exit_code == 1 and "--replica" in nameless.output


# --- full weights, one replica at a time; unload -------------------------------------------------------------


def _full_version(tmp_path: Path, reg: Registry, version: str = "v0001") -> dict[str, Any]:
    """A small full-weight version folder (config + weights file + manifest) stored in a local lake and registered."""
    folder = tmp_path / "lake" / "models" / version
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    stored = store_version(folder, lake_root=str(tmp_path / "lake"), version=version)
    return reg.add(
        version=version,
        version_number=int(version[1:]),
        base_model="base",
        kind="full",
        path=str(folder),
        artifact_uri=stored.uri,
        manifest_sha256=stored.manifest_sha256,
    )


def _commands(settings: Settings) -> list[dict[str, Any]]:
    """Every command on the models topic, in log order (one served name: one partition)."""
    from kafka import KafkaConsumer

    loader = _loader(settings, "reader", Path("/nonexistent"))
    consumer = KafkaConsumer(**kafka_python_config(settings.kafka, role="consumer"), enable_auto_commit=False)
    try:
        loader._assign(consumer, threading.Event())
        return [e for e in loader._catch_up(consumer) if e["status"] in ("release", "unload")]
    finally:
        consumer.close()


def test_an_unload_is_the_latest_command_for_its_name_and_full_weights_come_first() -> None:
    full = release_command({**_row("v2"), "kind": "full"}, served_name="p")
    events = [
        release_command(_row("v1"), served_name="p-planner"),
        release_command(_row("v1"), served_name="p"),
        unload_command(_row("v1"), served_name="p"),  # the first publish of "p" failed: nothing to load
    ]
    latest = latest_releases(events, "r1")
    assert {n: (e["status"], e["version"]) for n, e in latest.items()} == {
        "p-planner": ("release", "v1"),
        "p": ("unload", "v1"),
    }
    assert targets_me(unload_command(_row("v1"), served_name="p", targets=["r1"]), "r1")
    assert not targets_me(unload_command(_row("v1"), served_name="p", targets=["r2"]), "r1")
    # a restart drops every adapter, so the full-weight command is applied before the adapters
    assert list(latest_releases([*events, full], "r1")) == ["p", "p-planner"]


@pytest.mark.kafka
def test_a_full_version_goes_one_replica_at_a_time_and_stops_at_the_first_failure(
    settings: Settings, tmp_path: Path
) -> None:
    """r1 has no restart command: it refuses the version naming the setting, r2 never gets a command, and
    r1 (the only replica that got one) is sent an unload, since nothing of the line served before."""
    reg = Registry(Lake(str(tmp_path / "lake")))
    row = _full_version(tmp_path, reg)
    acks: dict[str, list[dict[str, Any]]] = {"r1": [], "r2": []}
    stop = threading.Event()
    threads = [
        threading.Thread(target=_loader(settings, r, tmp_path).run, args=(stop,), kwargs={"on_ack": acks[r].append})
        for r in acks
    ]
    for t in threads:
        t.start()
    try:
        pub = Publisher(
            registry=reg, vllm_url="", served_name="p", kafka=settings.kafka, replicas=("r1", "r2"), ack_timeout_s=20
        )
        with pytest.raises(PublishError, match="v0001 was not published: replica r1: .*serving.restart_command"):
            pub.publish("v0001")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    error = reg.get("v0001")["publish_error"]
    assert reg.get("v0001")["publish_status"] == "failed"
    assert "replica r2: not sent: the rollout stopped at replica r1" in error, error
    assert [(c["status"], c["version"], c["kind"], c["targets"]) for c in _commands(settings)] == [
        ("release", "v0001", "full", ["r1"]),
        ("unload", "v0001", "full", ["r1"]),
    ]
    (refused, unloaded) = acks["r1"]
    assert not refused["ok"] and "has no restart command: set serving.restart_command" in refused["error"]
    assert unloaded["release_id"] != refused["release_id"] and unloaded["serving_version"] is None
    assert acks["r2"] == [] and row["manifest_sha256"] == refused["manifest_sha256"]


@pytest.mark.kafka
def test_a_failing_restart_command_is_acked_with_its_error_and_the_gateway_paused_around_it(
    settings: Settings, tmp_path: Path
) -> None:
    """A real restart command that exits 3 after reading the gateway's state: the gateway was paused while
    it ran and is resumed after; the ack names the command's exit and its stderr."""
    import sys

    import httpx

    from collectors.gateway.serve import GatewayServer
    from serving.restart import command_restart
    from tests.collectors.helpers import LoopThread

    reg = Registry(Lake(str(tmp_path / "lake")))
    row = _full_version(tmp_path, reg)
    settings.gateway.port = 0
    settings.gateway.admin_token = "adm-secret"
    settings.gateway.upstreams = [f"http://127.0.0.1:{free_port()}"]
    lt = LoopThread()
    server = GatewayServer(settings)
    lt.run(server.start())
    seen = tmp_path / "seen.json"
    script = (
        "import httpx, json, sys; "
        "state = httpx.get(sys.argv[1] + '/admin/state', headers={'Authorization': 'Bearer adm-secret'}).json(); "
        "open(sys.argv[2], 'w').write(json.dumps({'paused': state['paused'], 'folder': sys.argv[3]})); "
        "sys.stderr.write('no GPU free for the new weights'); sys.exit(3)"
    )
    try:
        wait_until(lambda: server.sink.connected, 20, "the gateway's Kafka producer")  # type: ignore[attr-defined]
        gateway = f"http://127.0.0.1:{server.port}"
        loader = _loader(settings, "r1", tmp_path)
        loader.restart = command_restart([sys.executable, "-c", script, gateway, str(seen), "{folder}"])
        loader.gateway_url, loader.gateway_headers = gateway, settings.gateway.admin_headers()
        ack = loader.handle(release_command(row, served_name="p", targets=["r1"]))
        assert not server.gateway.paused  # resumed after the failure
        state = httpx.get(f"{gateway}/admin/state", headers=settings.gateway.admin_headers()).json()
        assert state["paused"] is False
    finally:
        lt.run(server.stop(), timeout=60)
        lt.close()
    assert not ack["ok"] and "exited 3: no GPU free for the new weights" in ack["error"], ack
    assert ack["serving_version"] is None  # its vLLM does not answer: what it serves is unknown
    ran = json.loads(seen.read_text())
    assert ran["paused"] is True  # the command ran while the gateway answered 429
    assert ran["folder"] == str(tmp_path / "lake" / "models" / "v0001")  # the verified folder (a local lake's own)
