"""Dagster in the local stack, in one of two shapes (``dagster.profile``).

``production`` (the default): the shape of a deployment. The instance lives in PostgreSQL (the local
``postgres`` part, or ``dagster.postgres_url``), and three managed processes run what a Dagster
deployment runs: the code location as a gRPC server (``dagster-code``, what the Helm chart's user
deployment runs), ``dagster-webserver`` (``dagster``) and ``dagster-daemon`` (sensors, schedules, the run
queue). The instance folder is ``<state>/dagster``, with a ``dagster.yaml`` and ``workspace.yaml`` written
at every `up`; the database password reaches Dagster only as ``DAGSTER_PG_PASSWORD`` in the environment.

``dev``: ``dagster dev`` with SQLite storage in ``dagster.home`` (the repository's ``dagster_home``), one
process that reloads code; run history of the two profiles is separate.
"""

from __future__ import annotations

import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from agentlake.stack import postgres, processes
from agentlake.stack.health import http_ok
from agentlake.stack.ports import free_port, port_free
from schemas.config import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = REPO_ROOT / "dagster_home"
CODE_MODULE = "pipelines.defs.definitions"
# SQLAlchemy 2.1 maps plain postgresql:// to psycopg 3; dagster-postgres ships psycopg2
SQLALCHEMY_SCHEME = "postgresql+psycopg2"
LOCATION_NAME = "pipelines"
PRODUCTION_HOME = "dagster"  # under the state folder
CODE_PART, WEBSERVER_PART, DAEMON_PART = "dagster-code", "dagster", "dagster-daemon"
NO_POSTGRES_WARNING = (
    "Dagster's production profile needs PostgreSQL (apt-get install postgresql, or dagster.postgres_url): "
    "running `dagster dev` on SQLite instead (the dev profile)"
)
# the daemons' heartbeats, as the webserver reads them from the instance's database
DAEMON_HEALTH_QUERY = "{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"


@dataclass(frozen=True)
class Part:
    """One Dagster process to start: what it runs, where it answers, how to tell it is up."""

    name: str
    argv: list[str]
    address: str
    probe: Callable[[], bool]
    timeout_s: float


def production(settings: Settings) -> bool:
    return settings.dagster.profile == "production"


def profile_of(webserver: processes.ManagedProcess) -> str:
    """The profile a running ``dagster`` part was started in: ``dagster dev`` or the webserver alone."""
    return "dev" if "dev" in webserver.argv[:5] else "production"


def dev_home(settings: Settings) -> Path:
    """The ``dev`` profile's instance folder (``DAGSTER_HOME``): ``dagster.home``.

    By default the repository's ``dagster_home`` (storage in ``dagster_home/storage``, git-ignored),
    so a ``DAGSTER_HOME=dagster_home dagster asset materialize`` by hand shares the instance, its UI
    and its run queue with `agentlake up --profile dev`. A folder without ``dagster.yaml`` gets the repository's.
    """
    home = settings.dagster.home.resolve()
    own = home / "dagster.yaml"
    template = TEMPLATE / "dagster.yaml"
    if not own.exists() and template.exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, own)
    return home


def production_home(settings: Settings) -> Path:
    return settings.state.dir.resolve() / PRODUCTION_HOME


def instance_home(settings: Settings) -> Path:
    """``DAGSTER_HOME`` of the stack in its profile."""
    return production_home(settings) if production(settings) else dev_home(settings)


def dev_workspace(settings: Settings) -> Path:
    """The instance's ``workspace.yaml``, else the repository's (the `pipelines` code location)."""
    own = settings.dagster.home.resolve() / "workspace.yaml"
    return own if own.exists() else TEMPLATE / "workspace.yaml"


def connection(settings: Settings) -> postgres.Connection | None:
    """The production instance's database: external, else the local cluster once it has started."""
    if not production(settings):
        return None
    if settings.dagster.postgres_url:
        return postgres.external_connection(settings.dagster)
    return postgres.local_connection(settings.state.dir.resolve())


def instance_env(settings: Settings) -> dict[str, str]:
    """``DAGSTER_HOME`` and, in production, the ``DAGSTER_PG_*`` variables: for every child and run."""
    env = {"DAGSTER_HOME": str(instance_home(settings))}
    conn = connection(settings)
    if conn is not None:
        env.update(conn.env())
    return env


def instance_config(conn: postgres.Connection) -> dict[str, Any]:
    """The production ``dagster.yaml``: the repository's settings (queue, pools, automation) on Postgres.

    Host, port, user and database are written out (a by-hand ``dagster`` command with this DAGSTER_HOME
    needs only ``DAGSTER_PG_PASSWORD``); the password is read from the environment.
    """
    config = yaml.safe_load((TEMPLATE / "dagster.yaml").read_text()) or {}
    config["storage"] = {
        "postgres": {
            "postgres_db": {
                "hostname": conn.host,
                "port": conn.port,
                "username": conn.user,
                "db_name": conn.database,
                "password": {"env": postgres.PASSWORD_ENV},
                "scheme": SQLALCHEMY_SCHEME,
            }
        }
    }
    return config


def write_instance(settings: Settings, conn: postgres.Connection, code_port: int) -> Path:
    """Write the production ``dagster.yaml`` and a ``workspace.yaml`` naming the code server; return the folder."""
    home = production_home(settings)
    home.mkdir(parents=True, exist_ok=True)
    header = (
        "# Written by `agentlake up` (production profile) at every start: edit dagster_home/dagster.yaml instead.\n"
    )
    (home / "dagster.yaml").write_text(header + yaml.safe_dump(instance_config(conn), sort_keys=False))
    workspace = {
        "load_from": [{"grpc_server": {"host": "127.0.0.1", "port": code_port, "location_name": LOCATION_NAME}}]
    }
    (home / "workspace.yaml").write_text(header + yaml.safe_dump(workspace, sort_keys=False))
    return home


def choose_code_port(settings: Settings, running_address: str | None) -> int:
    """The code server's port: the running one's, else that of the workspace written last time while free."""
    if running_address:
        return int(running_address.rsplit(":", 1)[1])
    try:
        last = yaml.safe_load((production_home(settings) / "workspace.yaml").read_text())
        port = int(last["load_from"][0]["grpc_server"]["port"])
        if port_free(port):
            return port
    except (OSError, KeyError, IndexError, TypeError, ValueError, yaml.YAMLError):
        pass
    return free_port()


def port_open(address: str) -> bool:
    """True when something accepts TCP connections at ``address`` (``grpc://host:port``)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
        return True
    except (OSError, ValueError):
        return False


def parts(settings: Settings, code_port: int = 0) -> list[Part]:
    """The processes of the profile, in start order (the code server first, the daemon last)."""
    d = settings.dagster
    web = f"http://{d.host}:{d.port}"
    if not production(settings):
        argv = [
            sys.executable,
            "-m",
            "dagster",
            "dev",
            "-w",
            str(dev_workspace(settings)),
            "-h",
            d.host,
            "-p",
            str(d.port),
        ]
        return [Part(WEBSERVER_PART, argv, web, lambda: http_ok(f"{web}/server_info"), 180)]
    workspace = str(production_home(settings) / "workspace.yaml")
    code = [
        sys.executable,
        "-m",
        "dagster",
        "api",
        "grpc",
        "-m",
        CODE_MODULE,
        "-d",
        str(REPO_ROOT),
        "-h",
        "127.0.0.1",
        "-p",
        str(code_port),
        "--location-name",
        LOCATION_NAME,
        "--use-python-environment-entry-point",
    ]
    webserver = [sys.executable, "-m", "dagster_webserver", "-w", workspace, "-h", d.host, "-p", str(d.port)]
    daemon = [sys.executable, "-m", "dagster._daemon", "run", "-w", workspace]
    return [
        Part(CODE_PART, code, f"grpc://127.0.0.1:{code_port}", lambda: port_open(f"127.0.0.1:{code_port}"), 180),
        Part(WEBSERVER_PART, webserver, web, lambda: http_ok(f"{web}/server_info"), 180),
        Part(DAEMON_PART, daemon, web, lambda: daemon_health(web)[0], 180),
    ]


def daemon_health(webserver: str, *, timeout_s: float = 3.0) -> tuple[bool, str]:
    """(every required daemon heartbeats, one line naming them), from the webserver's GraphQL.

    The daemon writes heartbeats to the instance's database; the webserver reads them there, so this
    also says the two processes share one instance.
    """
    try:
        r = httpx.post(f"{webserver}/graphql", json={"query": DAEMON_HEALTH_QUERY}, timeout=timeout_s)
        statuses = r.json()["data"]["instance"]["daemonHealth"]["allDaemonStatuses"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False, "no answer from the webserver about the daemon"
    required = [s for s in statuses if s.get("required")]
    sick = [s["daemonType"] for s in required if not s.get("healthy")]
    if not required:
        return False, "no daemon required on this instance"
    if sick:
        return False, f"no recent heartbeat: {', '.join(sick)}"
    return True, f"heartbeats: {', '.join(sorted(s['daemonType'] for s in required))}"
