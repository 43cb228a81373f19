"""The PostgreSQL that holds the production profile's Dagster instance: local and managed, or external.

Local: one cluster in ``<state>/postgres``, made once with ``initdb`` (user ``agentlake``, a generated
password kept in ``<state>/postgres.password``, mode 0600, and scram-sha-256 auth), served by a managed
``postgres`` on 127.0.0.1 only (no unix socket: the state folder's path can be longer than a socket name
may be), on the port of last time while free (``<state>/postgres.port``), with the database
``agentlake_dagster`` created on first start. PostgreSQL refuses to run as root: under root the server
runs as the ``postgres`` system user (from Debian's package) through ``setpriv``, and owns its folder.

External: ``dagster.postgres_url`` (``postgresql://user@host:port/db``) with the password in the
environment (``DAGSTER_PG_PASSWORD``), never in a settings file. Either way Dagster gets the connection
through ``DAGSTER_PG_*`` environment variables (``Connection.env``), as Dagster's own docs configure it.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from agentlake.stack import processes
from agentlake.stack.ports import free_port, port_free
from agentlake.stack.processes import StackError
from schemas.config import DagsterSettings

PART = "postgres"
DATA_DIR = "postgres"
PORT_FILE = "postgres.port"
PASSWORD_FILE = "postgres.password"
USER = "agentlake"
DATABASE = "agentlake_dagster"
SERVER_USER = "postgres"  # who runs the server when agentlake runs as root
PASSWORD_ENV = "DAGSTER_PG_PASSWORD"


@dataclass(frozen=True)
class Connection:
    """Where Dagster's instance database is; the password stays out of ``repr`` and logs."""

    host: str
    port: int
    user: str
    database: str
    password: str = field(default="", repr=False)

    @property
    def address(self) -> str:
        """The database as a URL without the password, for status lines and messages."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    def env(self) -> dict[str, str]:
        """The ``DAGSTER_PG_*`` variables a Postgres ``dagster.yaml`` reads (deploy/dagster.yaml)."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_DB": self.database,
            PASSWORD_ENV: self.password,
        }


def bin_dir() -> Path | None:
    """The folder of ``initdb``/``postgres``/``pg_ctl``: on PATH, else Debian's newest; None if absent."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def data_dir(state_dir: Path) -> Path:
    return state_dir / DATA_DIR


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account that runs the server when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError as exc:
        raise StackError(
            "PostgreSQL cannot run as root and there is no `postgres` user to run it as: run agentlake as an "
            "unprivileged user, create that user, or set dagster.postgres_url to an external database"
        ) from exc


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` as the server's account when we are root, keeping the right to enter folders.

    The ambient ``CAP_DAC_READ_SEARCH`` lets the server reach a state folder under a root-only parent
    (pytest's ``/tmp/pytest-of-root``, ``/root``) without loosening any folder's mode.
    """
    user = _server_user()
    if user is None:
        return argv
    return [
        "setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        "--init-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
        "--",
        *argv,
    ]


def _hand_over(path: Path) -> None:
    """Give ``path`` to the server's account (root only): PostgreSQL wants to own its folder."""
    user = _server_user()
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def password(state_dir: Path) -> str | None:
    try:
        return (state_dir / PASSWORD_FILE).read_text().strip() or None
    except OSError:
        return None


def remembered_port(state_dir: Path) -> int | None:
    try:
        port = int((state_dir / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def init_cluster(state_dir: Path) -> None:
    """``initdb`` the cluster once (user ``agentlake``, a generated password); a no-op when it exists."""
    data = data_dir(state_dir)
    if (data / "PG_VERSION").exists():
        return
    bins = bin_dir()
    if bins is None:
        raise StackError(
            "the production profile needs PostgreSQL (apt-get install postgresql) or dagster.postgres_url; "
            "`agentlake up --profile dev` runs Dagster without it"
        )
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    _hand_over(data)
    pw_file = state_dir / PASSWORD_FILE
    if password(state_dir) is None:
        pw_file.touch(mode=0o600)
        pw_file.write_text(secrets.token_urlsafe(24) + "\n")
    _hand_over(pw_file)  # initdb reads it as the server's user
    result = subprocess.run(
        _as_server_user(
            [
                str(bins / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                f"--pwfile={pw_file}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--no-instructions",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        raise StackError(f"initdb failed:\n{result.stdout}{result.stderr}")


def server_argv(state_dir: Path, port: int) -> list[str]:
    bins = bin_dir()
    assert bins is not None  # init_cluster ran
    return _as_server_user(
        [
            str(bins / "postgres"),
            "-D",
            str(data_dir(state_dir)),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
        ]
    )


def local_connection(state_dir: Path) -> Connection | None:
    """The local cluster's connection, from its port and password files; None before its first start."""
    port, pw = remembered_port(state_dir), password(state_dir)
    if port is None or pw is None:
        return None
    return Connection("127.0.0.1", port, USER, DATABASE, pw)


def external_connection(settings: DagsterSettings, environ: dict[str, str] | None = None) -> Connection:
    """``dagster.postgres_url`` with the password from ``DAGSTER_PG_PASSWORD``."""
    env = os.environ if environ is None else environ
    url = urlsplit(settings.postgres_url)
    return Connection(
        url.hostname or "127.0.0.1",
        url.port or 5432,
        unquote(url.username or "postgres"),
        url.path.lstrip("/") or DATABASE,
        env.get(PASSWORD_ENV, ""),
    )


def ok(conn: Connection, *, timeout_s: int = 2) -> bool:
    """True when the database answers a query with these credentials."""
    import psycopg2

    try:
        with psycopg2.connect(
            host=conn.host,
            port=conn.port,
            user=conn.user,
            password=conn.password,
            dbname=conn.database,
            connect_timeout=timeout_s,
        ) as db:
            with db.cursor() as cur:
                cur.execute("SELECT 1")
        return True
    except psycopg2.Error:
        return False


def _ensure_database(conn: Connection, proc: processes.ManagedProcess, timeout_s: float) -> None:
    """Wait until the server takes connections (it refuses them while it starts up), then create the database."""
    import psycopg2
    from psycopg2 import sql

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            db = psycopg2.connect(
                host=conn.host,
                port=conn.port,
                user=conn.user,
                password=conn.password,
                dbname="postgres",
                connect_timeout=5,
            )
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline or not proc.is_running():
                raise
            time.sleep(0.1)
    try:
        db.autocommit = True  # CREATE DATABASE cannot run in a transaction
        with db.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (conn.database,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(conn.database)))
    finally:
        db.close()


def start(state_dir: Path, *, port: int = 0, timeout_s: float = 60.0) -> Connection:
    """Start the local cluster unless it runs (``initdb`` first if needed); return its connection.

    ``port`` 0: the port of last time while free, else a free one.
    """
    existing = processes.read(state_dir, PART)
    if existing is not None and existing.is_running():
        conn = local_connection(state_dir)
        if conn is not None:
            return conn
    init_cluster(state_dir)
    last = remembered_port(state_dir)
    if not port:
        port = last if last is not None and port_free(last) else free_port()
    proc = processes.start(state_dir, PART, server_argv(state_dir, port), address=f"127.0.0.1:{port}")
    (state_dir / PORT_FILE).write_text(f"{port}\n")
    conn = local_connection(state_dir)
    assert conn is not None
    try:
        _ensure_database(conn, proc, timeout_s)
    except Exception as exc:
        stop(state_dir)
        tail = "\n".join(Path(proc.log).read_text(errors="replace").splitlines()[-15:])
        raise StackError(f"PostgreSQL did not start: {exc}; see {proc.log}:\n{tail}") from exc
    return conn


def stop(state_dir: Path, *, timeout_s: float = 30.0) -> bool:
    """Stop the local cluster with ``pg_ctl stop -m fast`` (no crash recovery next time); True if it ran."""
    managed = processes.read(state_dir, PART)
    if managed is None:
        return False
    bins = bin_dir()
    was_running = managed.is_running()
    if was_running and bins is not None:
        subprocess.run(
            _as_server_user([str(bins / "pg_ctl"), "stop", "-D", str(data_dir(state_dir)), "-m", "fast", "-w"]),
            capture_output=True,
            timeout=timeout_s,
        )
    processes.stop(state_dir, PART)  # the pid file; SIGTERM then SIGKILL if pg_ctl could not stop it
    return was_running
