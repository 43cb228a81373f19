"""A replica's loader: carry out release commands against the vLLM beside it, and say what it serves.

One loader runs next to each vLLM replica (`agentlake loader`). It reads the models topic, acts on
``release`` commands addressed to it (``targets`` empty, or naming its replica), and answers each on
the acks topic with a ``MODEL_RELEASE_ACK``:

1. fetch the version from the lake's object store into its own cache and verify every file against
   the manifest hash the command carries (``trainer.artifacts.local_copy``);
2. hot-load that folder under the served name (``/v1/load_lora_adapter``, ``load_inplace``), unless
   vLLM already serves that very folder under the name;
3. check that ``/v1/models`` lists the name with that folder as its root, and that one generation
   through the name answers;
4. ack ``ok`` with what vLLM serves now: the version is the last part of the adapter's root (the
   gateway records the same), the hash is the sha256 of the manifest in that folder.

A failure at any step is an ack with ``ok`` false and the error; if the new adapter had been loaded,
the folder served before is loaded again first (none before: the name is unloaded), so a replica that
fails keeps serving what it had and says what that is. Nothing a command does stops the loader.

On start a fresh vLLM serves no adapter, so the loader reads the topic from the beginning, applies the
latest command per served name, and then follows the topic. Every ``resync_s`` it also checks that vLLM
still lists each name it loaded: a vLLM that restarted (or was down when a command came) gets the latest
command again, and a new ack says so.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.config import KafkaSettings, Settings
from schemas.errors import AgentlakeError
from schemas.manifest import ManifestHashes
from schemas.tables import MODEL_RELEASE_ACK, MODEL_RELEASE_EVENT
from schemas.validation import validate_record
from trainer.artifacts import local_copy
from trainer.errors import PublishError
from trainer.releases import RELEASE, encode
from trainer.vllm_client import VllmClient

log = logging.getLogger(__name__)

AckHook = Callable[[dict[str, Any]], None]  # called with each ack the loader sends (tests, the CLI's log)


@dataclass(frozen=True)
class Served:
    """What vLLM serves under one name: the adapter's folder, the version (its last part), the manifest hash."""

    folder: str | None = None
    version: str | None = None
    sha256: str | None = None


def targets_me(event: Mapping[str, Any], replica: str) -> bool:
    """Whether a models-topic record is a release command this replica should carry out."""
    if event.get("status") != RELEASE:
        return False
    targets = event.get("targets") or []
    return not targets or replica in targets


def latest_releases(events: Iterable[Mapping[str, Any]], replica: str) -> dict[str, dict[str, Any]]:
    """The last command for this replica per served name, in log order (one name keeps one partition)."""
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        if targets_me(event, replica):
            latest[str(event["served_name"])] = dict(event)
    return latest


def served_under(client: VllmClient, name: str, hashes: ManifestHashes) -> Served:
    """What ``client``'s vLLM serves under ``name``, read back from vLLM and the folder it names (its
    manifest hashed as the gateway hashes it, ``schemas.manifest``)."""
    root = client.adapter_root(name)
    if root is None:
        return Served()
    return Served(root, Path(root).name, hashes.sha256(root))


def build_ack(
    event: Mapping[str, Any], replica: str, *, error: str | None, served: Served, seconds: float
) -> dict[str, Any]:
    """A ``MODEL_RELEASE_ACK`` answering ``event``: ok when there is no error."""
    ack = {
        "release_id": event.get("release_id") or "",
        "replica": replica,
        "served_name": event["served_name"],
        "version": event["version"],
        "manifest_sha256": event.get("manifest_sha256"),
        "ok": error is None,
        "error": error,
        "serving_version": served.version,
        "serving_sha256": served.sha256,
        "seconds": round(seconds, 4),
        "timestamp": dt.datetime.now(dt.UTC),
    }
    return validate_record(ack, MODEL_RELEASE_ACK)


@dataclass
class Loader:
    """Carries out release commands for one replica: its name, its vLLM, where it keeps downloads."""

    kafka: KafkaSettings
    replica: str
    vllm_url: str
    cache_dir: Path
    storage_options: Mapping[str, str] = field(default_factory=dict)
    api_key: str = ""
    check_prompt: str = "Hello"
    timeout_s: float = 120.0
    poll_ms: int = 200
    resync_s: float = 10.0
    # served name -> (its latest command, whether to re-apply it when vLLM lists no adapter under the name:
    # it was loaded, or vLLM was down when it came; not after the command itself failed)
    _latest: dict[str, tuple[dict[str, Any], bool]] = field(default_factory=dict, init=False, repr=False)
    _hashes: ManifestHashes = field(default_factory=ManifestHashes, init=False, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings, *, replica: str | None = None, vllm_url: str | None = None) -> Loader:
        """A loader from ``[serving]`` (its replica name, its vLLM), ``[kafka]`` and the lake's storage options."""
        serving = settings.serving
        name = replica or serving.replica
        if not name:
            raise AgentlakeError("a loader needs a replica name: pass --replica or set serving.replica")
        return cls(
            kafka=settings.kafka,
            replica=name,
            vllm_url=vllm_url or serving.vllm_url or settings.vllm.url,
            cache_dir=Path(serving.cache_dir or Path(settings.model.cache_dir) / "serving").absolute(),
            storage_options=dict(settings.lake.storage_options),
            api_key=settings.vllm.api_key(),
            check_prompt=serving.check_prompt,
        )

    def _client(self) -> VllmClient:
        """A client of the vLLM beside this loader, with its API key."""
        return VllmClient(self.vllm_url, timeout_s=self.timeout_s, api_key=self.api_key)

    # -- one command ------------------------------------------------------------------------------
    def handle(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Carry out one release command; the ack says how it went and what is served now. Never raises."""
        t0 = time.perf_counter()
        name = str(event["served_name"])
        client = self._client()
        before, loaded = Served(), False
        try:
            before = served_under(client, name, self._hashes)
            folder = self._fetch(event)
            if before.folder != folder:
                loaded = True
                client.load_lora(name, folder, inplace=True)
            now = served_under(client, name, self._hashes)
            if now.folder != folder:
                raise PublishError(f"after loading, vLLM lists {name!r} at {now.folder}, not {folder}")
            client.complete(name, self.check_prompt, max_tokens=1)
            error = None
        except Exception as exc:  # any failure becomes the ack's error: the loader keeps running
            error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, AgentlakeError) else str(exc)
            if loaded:
                self._restore(client, name, before)
        try:
            served = served_under(client, name, self._hashes)
        except Exception as exc:  # vLLM is away: say so, and that what it serves is unknown
            served = Served()
            error = error or f"cannot read what vLLM serves: {exc}"
        finally:
            client.close()
        ack = build_ack(event, self.replica, error=error, served=served, seconds=time.perf_counter() - t0)
        log.info(
            "%s: release %s of %s -> %s (serving %s)",
            self.replica,
            event["version"],
            name,
            "ok" if error is None else error,
            served.version,
        )
        return ack

    def _fetch(self, event: Mapping[str, Any]) -> str:
        """The command's version as a verified local folder whose last part is the version."""
        if event.get("kind") != "lora":
            raise PublishError(
                f"{event['version']} is a {event.get('kind')} version; the release bus hot-loads LoRA adapters only"
            )
        row = {
            "version": event["version"],
            "artifact_uri": event.get("artifact_uri"),
            "manifest_sha256": event.get("manifest_sha256"),
            "path": None,  # the trainer's disk is not this host's
        }
        return str(local_copy(row, cache_dir=self.cache_dir, storage_options=self.storage_options))

    @staticmethod
    def _restore(client: VllmClient, name: str, before: Served) -> None:
        """Serve again what was served before a failed command (nothing before: unload the name)."""
        try:
            if before.folder:
                client.load_lora(name, before.folder, inplace=True)
            else:
                client.unload_lora(name)
        except PublishError as exc:
            log.warning("could not restore %s to %s: %s", name, before.folder, exc)

    # -- the topic --------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, *, on_ack: AckHook | None = None) -> None:
        """Apply the latest command per served name, then follow the topic until ``stop`` is set."""
        from kafka import KafkaConsumer, KafkaProducer

        stop = stop or threading.Event()
        consumer = KafkaConsumer(
            **self.kafka.client_config(role="consumer"),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.poll_ms,
        )
        producer = KafkaProducer(**self.kafka.client_config(role="producer"), acks="all", linger_ms=0)
        try:
            self._assign(consumer, stop)
            for event in latest_releases(self._catch_up(consumer), self.replica).values():
                self._apply(producer, event, on_ack)
            log.info("%s: following %s", self.replica, self.kafka.models_topic)
            checked = time.monotonic()
            while not stop.is_set():
                for event in self._poll(consumer, self.poll_ms):
                    if targets_me(event, self.replica):
                        self._apply(producer, event, on_ack)
                if time.monotonic() - checked >= self.resync_s:
                    for event in self._lost():
                        log.warning(
                            "%s: vLLM lists no %s; loading %s again",
                            self.replica,
                            event["served_name"],
                            event["version"],
                        )
                        self._apply(producer, event, on_ack)
                    checked = time.monotonic()
        finally:
            consumer.close()
            producer.close(timeout=5)

    def _apply(self, producer: Any, event: dict[str, Any], on_ack: AckHook | None) -> None:
        """Handle one command, send its ack, and remember it for the resync."""
        ack = self.handle(event)
        self._answer(producer, ack, on_ack)
        self._latest[str(event["served_name"])] = (event, ack["ok"] or not self._vllm_up())

    def _vllm_up(self) -> bool:
        client = self._client()
        try:
            return client.healthy()
        finally:
            client.close()

    def _lost(self) -> list[dict[str, Any]]:
        """The commands to apply again: vLLM answers but lists no adapter under their name."""
        client = self._client()
        try:
            if not client.healthy():
                return []
            return [e for name, (e, again) in self._latest.items() if again and client.adapter_root(name) is None]
        except PublishError as exc:
            log.warning("%s: cannot list vLLM's adapters: %s", self.replica, exc)
            return []
        finally:
            client.close()

    def _assign(self, consumer: Any, stop: threading.Event) -> None:
        from kafka import TopicPartition

        topic = self.kafka.models_topic
        while (parts := consumer.partitions_for_topic(topic)) is None:
            if stop.wait(1.0):
                return
            log.info("%s: waiting for topic %s", self.replica, topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)

    def _catch_up(self, consumer: Any) -> list[dict[str, Any]]:
        """Every record up to the end of the log (two empty polls in a row: the broker's end offsets are
        not to be trusted on every engine)."""
        events: list[dict[str, Any]] = []
        empty = 0
        while empty < 2:
            batch = self._poll(consumer, 1000)
            empty = 0 if batch else empty + 1
            events += batch
        return events

    def _poll(self, consumer: Any, timeout_ms: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for records in consumer.poll(timeout_ms=timeout_ms).values():
            for record in records:
                try:
                    out.append(validate_record(json.loads(record.value), MODEL_RELEASE_EVENT))
                except (ValueError, AgentlakeError) as exc:
                    log.warning("skipping unreadable record at offset %s: %s", record.offset, exc)
        return out

    def _answer(self, producer: Any, ack: dict[str, Any], on_ack: AckHook | None) -> None:
        from kafka.errors import KafkaError

        value, headers = encode(ack, MODEL_RELEASE_ACK)
        try:
            producer.send(self.kafka.model_acks_topic, key=self.replica.encode(), value=value, headers=headers).get(
                timeout=20
            )
        except KafkaError as exc:  # the publisher times out and names this replica; the loader goes on
            log.warning("%s: ack for %s not sent: %s", self.replica, ack["release_id"], exc)
        if on_ack is not None:
            on_ack(ack)
