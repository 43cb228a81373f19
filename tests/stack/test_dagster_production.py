"""The production profile for real: PostgreSQL, a code server, dagster-webserver and dagster-daemon.

Spans go into the test broker; nothing but the daemon's sensors starts a run, and the runs, their
events and the daemon's heartbeats are read back from the instance in PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import psutil
import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus

from agentlake.stack import dagster, local, postgres, processes
from agentlake.stack.ports import free_port
from schemas.config import KafkaSettings, Settings, load_settings
from schemas.errors import ConfigError
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record

pytestmark = [
    pytest.mark.slow,
    pytest.mark.kafka,
    pytest.mark.skipif(postgres.bin_dir() is None, reason="PostgreSQL is not installed (apt-get install postgresql)"),
]

TIMEOUT_S = 600  # two cores shared with other tests: the daemon's first runs take a while


def production_settings(tmp_path: Path, kafka: KafkaSettings, **dagster_settings: str) -> Settings:
    return load_settings(
        environ={},
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "lake": {"root": str(tmp_path / "lake")},
            "kafka": kafka.model_dump(),
            "collector": {"http_port": free_port(), "grpc_port": free_port()},
            "dagster": {"profile": "production", "port": free_port(), **dagster_settings},
            "tracking": {"server": False},  # speed: the MLflow server has tests of its own
        },
    )


def open_instance(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> DagsterInstance:
    """The stack's instance as any tool opens it: its DAGSTER_HOME and the DAGSTER_PG_* variables."""
    for key, value in dagster.instance_env(settings).items():
        monkeypatch.setenv(key, value)
    return DagsterInstance.from_config(str(dagster.production_home(settings)))


def wait_for(what: str, probe: Callable[[], bool], deadline: float) -> None:
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.5)  # one query against the instance database
    raise AssertionError(f"{what} within {TIMEOUT_S}s")


def test_daemon_on_postgres_materializes_by_sensor(
    tmp_path: Path, kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = production_settings(tmp_path, kafka_settings)
    sdir = local.state_dir(settings)
    rollouts = [
        Rollout(f"r{i}", task_id="sum", calls=[Call(prompt=[1, 2], response=[3 + i], logprobs=[-0.1])], final_reward=r)
        for i, r in enumerate([1.0, 0.0, 0.5])
    ]
    family: list[psutil.Process] = []
    try:
        t0 = time.monotonic()
        rows = local.up(settings)
        up_s = time.monotonic() - t0
        by_name = {r.name: r for r in rows}
        for part in ("postgres", "dagster-code", "dagster", "dagster-daemon"):
            assert by_name[part].healthy, rows
        assert "SENSOR" in by_name["dagster-daemon"].detail, by_name["dagster-daemon"]
        family = [
            p
            for proc in processes.list_managed(sdir)
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        ]
        argv = {proc.name: " ".join(proc.argv) for proc in processes.list_managed(sdir)}
        assert "dagster_webserver" in argv["dagster"] and " dev " not in argv["dagster"]
        assert "dagster._daemon run" in argv["dagster-daemon"]

        t1 = time.monotonic()
        k = settings.kafka
        produce(k, k.spans_topic, [span_record(make_spans(r), key=r.rollout_id) for r in rollouts])

        instance = open_instance(settings, monkeypatch)
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        deadline = time.monotonic() + TIMEOUT_S
        marks: dict[str, float] = {}

        def materialized(key: str) -> bool:
            if instance.get_latest_materialization_event(AssetKey(key)) is not None:
                marks.setdefault(key, time.monotonic() - t1)
            return key in marks

        wait_for("the Kafka sensor's run materializes spans", lambda: materialized("spans"), deadline)
        wait_for("a sensor's run materializes trajectories", lambda: materialized("trajectories"), deadline)
        wait_for("a sensor's run materializes transitions", lambda: materialized("transitions"), deadline)

        last = instance.get_latest_materialization_event(AssetKey("transitions"))
        assert last is not None

        def finished() -> bool:
            run = instance.get_run_by_id(last.run_id)
            return run is not None and run.is_finished

        wait_for("the run that materialized transitions finishes", finished, deadline)
        runs = instance.get_runs()
        assert all(run.status == DagsterRunStatus.SUCCESS for run in runs if run.is_finished), runs
        origins = {run.tags.get("dagster/sensor_name") for run in runs}
        assert "kafka_sensor" in origins, [run.tags for run in runs]
        # every run was started by a sensor of the daemon: nothing here launched one
        assert None not in origins, [run.tags for run in runs]
        for key in ("spans", "trajectories", "transitions"):
            event = instance.get_latest_materialization_event(AssetKey(key))
            assert event is not None and event.run_id in {run.run_id for run in runs}
        traj = pl.read_delta(str(tmp_path / "lake" / "trajectories")).sort("rollout_id")
        assert traj["rollout_id"].to_list() == ["r0", "r1", "r2"]
        assert traj["final_reward"].to_list() == [1.0, 0.0, 0.5]
        print(
            f"\nproduction profile: up {up_s:.1f}s (collector, postgres, code server, webserver, daemon); "
            f"spans materialized {marks['spans']:.1f}s, trajectories {marks['trajectories']:.1f}s, "
            f"transitions {marks['transitions']:.1f}s after producing"
        )
        instance.dispose()
    finally:
        stopped = local.down(settings)
    assert {"postgres", "dagster-code", "dagster", "dagster-daemon"} <= set(stopped), stopped
    assert not processes.wait_exited(family, 15), "down must stop every process it started"
    log = (sdir / "logs" / "postgres.log").read_text()
    assert "received fast shutdown request" in log and "database system is shut down" in log


def test_local_postgres_restarts_with_its_port_password_and_data(tmp_path: Path, kafka_settings: KafkaSettings) -> None:
    """PostgreSQL alone: its row in `status`, a fast stop, a restart on the same port and password, data kept."""
    import psycopg2

    settings = production_settings(tmp_path, kafka_settings)
    sdir = local.state_dir(settings)

    def sql(conn: postgres.Connection, query: str) -> list[tuple]:
        with psycopg2.connect(
            host=conn.host, port=conn.port, user=conn.user, password=conn.password, dbname=conn.database
        ) as db:
            with db.cursor() as cur:
                cur.execute(query)
                return cur.fetchall() if cur.description else []

    try:
        conn = postgres.start(sdir)
        assert postgres.ok(conn)
        assert not postgres.ok(postgres.Connection(conn.host, conn.port, conn.user, conn.database, "wrong"))
        row = next(r for r in local.status(settings) if r.name == "postgres")
        assert row.healthy and row.address == conn.address and str(conn.port) in row.address
        assert (sdir / postgres.PASSWORD_FILE).stat().st_mode & 0o077 == 0, "the password file is private"
        sql(conn, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)")
        assert postgres.stop(sdir)
        assert not next(r for r in local.status(settings) if r.name == "postgres").healthy
        again = postgres.start(sdir)
        assert again == conn, "same port and password after a restart"
        assert sql(again, "SELECT n FROM kept") == [(7,)]
    finally:
        postgres.stop(sdir)
    assert "database system was shut down at" in (sdir / "logs" / "postgres.log").read_text(), "a clean shutdown"


def test_external_database_takes_its_password_from_the_environment(
    tmp_path: Path, kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dagster.postgres_url`` names a database agentlake does not start; the password is only in the environment."""
    elsewhere = tmp_path / "managed-db"  # a PostgreSQL that stands in for a managed one
    elsewhere.mkdir()
    try:
        db = postgres.start(elsewhere)
        settings = production_settings(tmp_path, kafka_settings, postgres_url=db.address)
        monkeypatch.setenv(postgres.PASSWORD_ENV, db.password)
        assert dagster.connection(settings) == db
        assert dagster.instance_env(settings)["DAGSTER_PG_PORT"] == str(db.port)
        row = next(r for r in local.status(settings) if r.name == "postgres")
        assert row.healthy and row.pid is None and "external" in row.detail
        monkeypatch.setenv(postgres.PASSWORD_ENV, "not-the-password")
        assert not next(r for r in local.status(settings) if r.name == "postgres").healthy
    finally:
        postgres.stop(elsewhere)
    assert not (tmp_path / "state" / postgres.DATA_DIR).exists(), "no local cluster for an external database"


def test_a_password_in_the_database_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="DAGSTER_PG_PASSWORD"):
        load_settings(environ={}, overrides={"dagster": {"postgres_url": "postgresql://u:secret@db:5432/d"}})
    with pytest.raises(ConfigError, match="postgresql://"):
        load_settings(environ={}, overrides={"dagster": {"postgres_url": "mysql://u@db/d"}})
