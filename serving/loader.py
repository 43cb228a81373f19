"""A replica's loader: carry out release commands against the vLLM beside it, and say what it serves.

One loader runs next to each vLLM replica (`agentlake loader`). It reads the models topic, acts on
commands addressed to it (``targets`` empty, or naming its replica), and answers each on the acks topic
with a ``MODEL_RELEASE_ACK``.

``release`` of a LoRA adapter (``kind == "lora"``):

1. fetch the version from the lake's object store into its own cache and verify every file against
   the manifest hash the command carries (``trainer.artifacts.local_copy``);
2. hot-load that folder under the served name (``/v1/load_lora_adapter``, ``load_inplace``), unless
   vLLM already serves that very folder under the name;
3. check that ``/v1/models`` lists the name with that folder as its root, and that one generation
   through the name answers;
4. ack ``ok`` with what vLLM serves now: the version is the last part of the adapter's root (the
   gateway records the same), the hash is the sha256 of the manifest in that folder.

``release`` of full weights (``kind == "full"``): vLLM cannot swap its base weights, so the loader restarts
it with the replica's ``restart_command`` (``serving.restart_command``; none: the command is refused with an
ack that names the setting). Fetch and verify as above; unless vLLM already runs on that folder, pause the
gateway in front of this replica (``serving.gateway_url``: agents get 429 + Retry-After, not errors), run the
restart command on the folder, wait for vLLM's health (``restart_timeout_s``), check that ``/v1/models``
reports the folder as the base model's root and that one generation answers, resume the gateway (always),
and ack with the folder's version and manifest hash. If anything after the restart began fails, vLLM is
restarted again on the folder it ran before (when known) before the ack says why.

``unload`` ("serve nothing under this name", sent when the first publish of a line failed): an adapter is
unloaded (``/v1/unload_lora_adapter``); for full weights vLLM is restarted on the folder it ran when the
loader started (the base model). The ack then says nothing is served under the name.

``evaluate`` (the eval gate on the canary, serving.canary; only when ``targets`` names this replica): fetch and
verify the candidate as above, load it under ``<served>-candidate-<version>``, score it next to what the served
name serves (the base model when nothing) on the tasks the command carries, unload it, and ack with both scores.
The served name is not touched, and an evaluate command is not a release: catch-up and resync never replay it.

A failure at any step is an ack with ``ok`` false and the error; if the new adapter had been loaded,
the folder served before is loaded again first (none before: the name is unloaded), so a replica that
fails keeps serving what it had and says what that is. Nothing a command does stops the loader.

On start a fresh vLLM serves no adapter, so the loader reads the topic from the beginning, applies the
latest command per served name (full weights first: a restart drops every adapter), and then follows the
topic. An unload as the latest command means nothing to load; a full-weight command whose folder vLLM already
runs on restarts nothing, so a loader that restarts does not restart its vLLM again. Every ``resync_s`` it also
checks that vLLM still serves each name it loaded: a vLLM that restarted (or was down when a command came)
gets the latest command again, and a new ack says so. A command that failed while vLLM answered is not
retried, so a version that cannot start never restarts vLLM in a loop.

Serving follows the registry (``registry``, on unless ``serving.follow_registry`` is off): at start and every
``resync_s``, each policy line's serving version in ``model_versions`` (serving.restore) that vLLM lacks (no
adapter under the line's name: a vLLM that restarted, or came up with `agentlake up --vllm`) is released
again, as a command of its own, acked like one. While vLLM is down or lacks one, the gateway in front
(``gateway_url``) holds the policy names (503 + Retry-After, serving.gateway_pause); it is released once every
line was tried. A version that failed while vLLM answered is not tried again until vLLM goes away. An adapter
under the name, whatever its folder, is left alone: the publisher loads before it marks the registry, and a
version that differs shows in `agentlake status`, not as a load fighting the publisher.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.config import KafkaSettings, Settings
from schemas.errors import AgentlakeError
from schemas.kafka import kafka_python_config
from schemas.manifest import ManifestHashes
from schemas.tables import MODEL_RELEASE_ACK, MODEL_RELEASE_EVENT
from schemas.validation import validate_record
from serving.canary import EVALUATE, evaluate, evaluates_here
from serving.errors import PublishError
from serving.gateway_pause import GATEWAY_HOLD, GATEWAY_PAUSE, GATEWAY_RELEASE, GATEWAY_RESUME, drain, gateway_call
from serving.releases import COMMANDS, UNLOAD, encode
from serving.restart import command_restart
from serving.restore import lacks, restore_commands
from serving.vllm_client import VllmClient
from trainer.artifacts import local_copy

log = logging.getLogger(__name__)

AckHook = Callable[[dict[str, Any]], None]  # called with each ack the loader sends (tests, the CLI's log)
RegistryRows = Callable[[], list[dict[str, Any]]]  # the registry's rows (trainer.registry.Registry.rows)
RESTART_SETTING = "serving.restart_command"  # named in the refusal of a full-weight version without one


@dataclass(frozen=True)
class Served:
    """What vLLM serves under one name: the adapter's folder, the version (its last part), the manifest hash."""

    folder: str | None = None
    version: str | None = None
    sha256: str | None = None


def targets_me(event: Mapping[str, Any], replica: str) -> bool:
    """Whether a models-topic record is a command (release, unload) this replica should carry out."""
    if event.get("status") not in COMMANDS:
        return False
    targets = event.get("targets") or []
    return not targets or replica in targets


def latest_releases(events: Iterable[Mapping[str, Any]], replica: str) -> dict[str, dict[str, Any]]:
    """The last command for this replica per served name, in log order (one name keeps one partition);
    full-weight commands first, since restarting vLLM drops every adapter loaded before."""
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        if targets_me(event, replica):
            latest[str(event["served_name"])] = dict(event)
    return dict(sorted(latest.items(), key=lambda kv: kv[1].get("kind") != "full"))


def served_under(client: VllmClient, name: str, hashes: ManifestHashes) -> Served:
    """What ``client``'s vLLM serves under ``name``, read back from vLLM and the folder it names (its
    manifest hashed as the gateway hashes it, ``schemas.manifest``)."""
    root = client.adapter_root(name)
    if root is None:
        return Served()
    return Served(root, Path(root).name, hashes.sha256(root))


def served_base(client: VllmClient, hashes: ManifestHashes) -> Served:
    """What ``client``'s vLLM runs as its base model (a full-weight version is served so): its folder, the
    folder's last part, and its manifest hash (None for a base model without one)."""
    base = client.base_model()
    if base is None or not base[1]:
        return Served()
    return Served(base[1], Path(base[1]).name, hashes.sha256(base[1]))


def same_folder(a: str | None, b: str | None) -> bool:
    """Whether two folder paths name the same folder (vLLM reports ``--model`` as it was given)."""
    return bool(a and b) and os.path.normpath(str(a)) == os.path.normpath(str(b))


def _error_text(exc: BaseException) -> str:
    """An ack's error: our own errors say what to do already; others get their type named."""
    return str(exc) if isinstance(exc, AgentlakeError) else f"{type(exc).__name__}: {exc}"


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
    restart: Callable[[str], None] | None = None  # full weights: restart this vLLM on a folder (serving.restart)
    restart_timeout_s: float = 600.0  # vLLM's health after a restart
    gateway_url: str | None = None  # the gateway in front of this vLLM, paused around a restart
    gateway_headers: Mapping[str, str] = field(default_factory=dict)  # its admin token
    registry: RegistryRows | None = None  # restore each line's serving version vLLM lacks (None: the bus only)
    served_name: str = "agentlake-policy"  # model.served_name: the lines' names derive from it
    # served name -> (its latest command, whether to re-apply it when vLLM lists no adapter under the name:
    # it was loaded, or vLLM was down when it came; not after the command itself failed)
    _latest: dict[str, tuple[dict[str, Any], bool]] = field(default_factory=dict, init=False, repr=False)
    _hashes: ManifestHashes = field(default_factory=ManifestHashes, init=False, repr=False)
    # the folder vLLM ran when this loader first read it: where an unload of full weights goes back to
    _base_folder: str | None = field(default=None, init=False, repr=False)
    _held: bool = field(default=False, init=False, repr=False)  # the gateway holds the policy names for us
    # (served name, version) restored from the registry that failed while vLLM answered: not tried again
    _given_up: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        replica: str | None = None,
        vllm_url: str | None = None,
        restart_command: Sequence[str] | None = None,
        gateway_url: str | None = None,
    ) -> Loader:
        """A loader from ``[serving]`` (its replica name, its vLLM, its restart command and gateway), ``[kafka]``,
        ``gateway.admin_token`` and the lake's storage options; the arguments override the settings."""
        serving = settings.serving
        name = replica or serving.replica
        if not name:
            raise AgentlakeError("a loader needs a replica name: pass --replica or set serving.replica")
        argv = list(restart_command or serving.restart_command)
        try:
            restart = command_restart(argv, timeout_s=serving.restart_timeout_s)
        except PublishError as exc:
            raise AgentlakeError(f"{RESTART_SETTING}: {exc}") from exc
        return cls(
            kafka=settings.kafka,
            replica=name,
            vllm_url=vllm_url or serving.vllm_url or settings.vllm.url,
            cache_dir=Path(serving.cache_dir or Path(settings.model.cache_dir) / "serving").absolute(),
            storage_options=dict(settings.lake.storage_options),
            api_key=settings.vllm.api_key(),
            check_prompt=serving.check_prompt,
            restart=restart,
            restart_timeout_s=serving.restart_timeout_s,
            gateway_url=gateway_url or serving.gateway_url or None,
            gateway_headers=settings.gateway.admin_headers(),
            registry=_registry_rows(settings) if serving.follow_registry and _lake_engine(name) else None,
            served_name=settings.model.served_name,
            resync_s=serving.resync_s,
        )

    def _client(self) -> VllmClient:
        """A client of the vLLM beside this loader, with its API key."""
        return VllmClient(self.vllm_url, timeout_s=self.timeout_s, api_key=self.api_key)

    # -- one command ------------------------------------------------------------------------------
    def handle(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Carry out one command; the ack says how it went and what is served now. Never raises."""
        t0 = time.perf_counter()
        name = str(event["served_name"])
        full = event.get("kind") == "full"
        client = self._client()
        scored: dict[str, Any] = {}  # an evaluate command's scores, for its ack
        try:
            if event.get("status") == UNLOAD:
                error = self._unload(client, event)
            elif event.get("status") == EVALUATE:  # serving.canary: the served name is left as it is
                error, scored = evaluate(client, event, self._fetch)
            elif full:
                error = self._release_full(client, event)
            else:
                error = self._release_lora(client, event)
            try:
                served = served_base(client, self._hashes) if full else served_under(client, name, self._hashes)
            except Exception as exc:  # vLLM is away: say so, and that what it serves is unknown
                served = Served()
                error = error or f"cannot read what vLLM serves: {exc}"
        finally:
            client.close()
        if event.get("status") == UNLOAD and error is None:
            served = Served()  # nothing of this line is served: the base model is not a version of it
        ack = build_ack(event, self.replica, error=error, served=served, seconds=time.perf_counter() - t0) | scored
        log.info(
            "%s: %s %s of %s -> %s (serving %s)",
            self.replica,
            event["status"],
            event["version"],
            name,
            "ok" if error is None else error,
            served.version,
        )
        return ack

    def _release_lora(self, client: VllmClient, event: Mapping[str, Any]) -> str | None:
        """Hot-load the command's adapter under its name (the error, or None)."""
        name = str(event["served_name"])
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
        except Exception as exc:  # any failure becomes the ack's error: the loader keeps running
            if loaded:
                self._restore(client, name, before)
            return _error_text(exc)
        return None

    def _release_full(self, client: VllmClient, event: Mapping[str, Any]) -> str | None:
        """Restart vLLM on the command's full-weight folder, unless it runs on it already (the error, or None)."""
        if self.restart is None:
            return (
                f"{event['version']} is a full-weight version and replica {self.replica} has no restart command: "
                f"set {RESTART_SETTING} (an argv with {{folder}} that restarts this vLLM on that folder) or "
                "pass --restart-command to `agentlake loader`"
            )
        try:
            folder = self._fetch(event)
            before = self._base_root(client)
            if same_folder(before, folder):
                self._check_base(client, folder)  # idempotent: nothing to restart
            else:
                self._restart_on(client, folder, back_to=before)
        except Exception as exc:
            return _error_text(exc)
        return None

    def _unload(self, client: VllmClient, event: Mapping[str, Any]) -> str | None:
        """Serve nothing under the command's name: unload the adapter, or for full weights restart vLLM on the
        folder it ran when this loader started (the error, or None)."""
        name = str(event["served_name"])
        try:
            if event.get("kind") != "full":
                if client.adapter_root(name) is not None:
                    client.unload_lora(name)
                if (left := client.adapter_root(name)) is not None:
                    raise PublishError(f"after unloading, vLLM still lists {name!r} at {left}")
                return None
            if self._base_folder is None:
                raise PublishError("this loader never saw the folder vLLM ran before; restart vLLM on its base model")
            if self.restart is None:
                raise PublishError(f"no restart command to go back to {self._base_folder}: set {RESTART_SETTING}")
            before = self._base_root(client)
            if not same_folder(before, self._base_folder):
                self._restart_on(client, self._base_folder, back_to=None)
        except Exception as exc:
            return _error_text(exc)
        return None

    def _base_root(self, client: VllmClient) -> str | None:
        """The folder vLLM runs as its base model; None when it does not answer (nothing to go back to)."""
        try:
            return served_base(client, self._hashes).folder
        except PublishError as exc:
            log.warning("%s: cannot read vLLM's base model: %s", self.replica, exc)
            return None

    def _restart_on(self, client: VllmClient, folder: str, *, back_to: str | None) -> None:
        """With the gateway paused and drained, restart vLLM on ``folder`` and check it; on a failure restart it on
        ``back_to`` (if known) before raising. The gateway is resumed whatever happens."""
        assert self.restart is not None
        paused = gateway_call(self.gateway_url, GATEWAY_PAUSE, headers=self.gateway_headers)
        try:
            if paused and self.gateway_url:
                drain(self.gateway_url, headers=self.gateway_headers, timeout_s=self.timeout_s)
            try:
                self.restart(folder)
                self._check_base(client, folder)
            except Exception as exc:
                if back_to is None or same_folder(back_to, folder):
                    raise
                log.warning("%s: restart on %s failed (%s); restarting on %s", self.replica, folder, exc, back_to)
                try:
                    self.restart(back_to)
                    self._check_base(client, back_to)
                except Exception as again:
                    raise PublishError(f"{_error_text(exc)}; and restarting on {back_to} failed: {again}") from exc
                raise
        finally:
            if paused:
                gateway_call(self.gateway_url, GATEWAY_RESUME, headers=self.gateway_headers)

    def _check_base(self, client: VllmClient, folder: str) -> None:
        """Wait for vLLM's health (``restart_timeout_s``), then check that it runs ``folder`` as its base
        model and that one generation through it answers."""
        deadline = time.monotonic() + self.restart_timeout_s
        while not client.healthy():
            if time.monotonic() > deadline:
                raise PublishError(f"vLLM at {self.vllm_url} was not healthy within {self.restart_timeout_s:.0f}s")
            time.sleep(0.5)
        base = client.base_model()
        if base is None or not same_folder(base[1], folder):
            raise PublishError(f"vLLM runs {base[1] if base else 'no base model'}, not {folder}")
        client.complete(base[0], self.check_prompt, max_tokens=1)

    def _fetch(self, event: Mapping[str, Any]) -> str:
        """The command's version as a verified local folder whose last part is the version (an adapter or a
        full-weight folder alike: the manifest lists every file)."""
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
            **kafka_python_config(self.kafka, role="consumer"),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.poll_ms,
        )
        producer = KafkaProducer(**kafka_python_config(self.kafka, role="producer"), acks="all", linger_ms=0)
        try:
            self._assign(consumer, stop)
            self._base_folder = self._base_folder or self._first_base()
            for event in latest_releases(self._catch_up(consumer), self.replica).values():
                self._apply(producer, event, on_ack)
            self.follow_registry(lambda ack: self._answer(producer, ack, on_ack))
            log.info("%s: following %s", self.replica, self.kafka.models_topic)
            checked = time.monotonic()
            while not stop.is_set():
                for event in self._poll(consumer, self.poll_ms):
                    if targets_me(event, self.replica):
                        self._apply(producer, event, on_ack)
                    elif evaluates_here(event, self.replica):  # not a release: never kept for the resync
                        self._answer(producer, self.handle(event), on_ack)
                if time.monotonic() - checked >= self.resync_s:
                    for event in self._lost():
                        log.warning(
                            "%s: vLLM no longer serves %s as asked; applying %s again",
                            self.replica,
                            event["served_name"],
                            event["version"],
                        )
                        self._apply(producer, event, on_ack)
                    self.follow_registry(lambda ack: self._answer(producer, ack, on_ack))
                    checked = time.monotonic()
        finally:
            consumer.close()
            producer.close(timeout=5)

    def _apply(self, producer: Any, event: dict[str, Any], on_ack: AckHook | None) -> None:
        """Handle one command, send its ack, and remember it for the resync."""
        ack = self.handle(event)
        self._answer(producer, ack, on_ack)
        self._latest[str(event["served_name"])] = (event, ack["ok"] or not self._vllm_up())

    # -- the registry ----------------------------------------------------------------------------
    def follow_registry(self, answer: AckHook | None = None) -> list[dict[str, Any]]:
        """Release again each line's registry version that vLLM lacks, holding the gateway's policy names
        meanwhile (and while vLLM is down); the acks of what it released (each also given to ``answer``)."""
        if self.registry is None:
            return []
        if not self._vllm_up():
            self._given_up.clear()  # a vLLM that comes back gets every version tried again
            self._hold(True)
            return []
        try:
            commands = restore_commands(self.registry(), self.served_name)
            client = self._client()
            try:
                lacking = [c for c in commands if (c["served_name"], c["version"]) not in self._given_up]
                lacking = [c for c in lacking if lacks(client, c)]
            finally:
                client.close()
        except Exception as exc:  # a registry or vLLM that cannot be read now: try again at the next resync
            log.warning("%s: cannot compare vLLM with the registry: %s", self.replica, _error_text(exc))
            self._hold(False)  # never hold agents on what cannot be read
            return []
        acks = []
        if lacking:
            self._hold(True)
        for command in lacking:
            log.warning(
                "%s: vLLM lacks %s of %s (the registry serves it); loading it again",
                self.replica,
                command["version"],
                command["served_name"],
            )
            ack = self.handle(command)
            if not ack["ok"] and self._vllm_up():
                self._given_up.add((str(command["served_name"]), str(command["version"])))
            acks.append(ack)
            if answer is not None:
                answer(ack)
        self._hold(False)
        return acks

    def _hold(self, on: bool) -> None:
        """Hold (or release) the gateway's policy names; a gateway that restarted held is released too."""
        if not self.gateway_url:
            return
        if not on and not self._held:
            self._held = self._gateway_restoring()
        if on != self._held and gateway_call(
            self.gateway_url, GATEWAY_HOLD if on else GATEWAY_RELEASE, headers=self.gateway_headers
        ):
            self._held = on
            log.info("%s: gateway %s the policy names", self.replica, "holds" if on else "released")

    def _gateway_restoring(self) -> bool:
        """Whether the gateway holds the policy names now (started so: ``gateway.hold_until_restored``)."""
        import httpx

        assert self.gateway_url is not None
        try:
            resp = httpx.get(f"{self.gateway_url.rstrip('/')}/health", timeout=5.0)
            return bool(resp.json().get("restoring"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    def _vllm_up(self) -> bool:
        client = self._client()
        try:
            return client.healthy()
        finally:
            client.close()

    def _first_base(self) -> str | None:
        """The folder vLLM runs before this loader changed anything (None while vLLM does not answer)."""
        client = self._client()
        try:
            return self._base_root(client)
        finally:
            client.close()

    def _lost(self) -> list[dict[str, Any]]:
        """The commands to apply again: vLLM answers but no longer serves what they asked for (no adapter
        under their name; for full weights, a base model whose manifest is not the command's). Unloads and
        commands that failed while vLLM answered are not retried, so nothing restarts vLLM in a loop."""
        client = self._client()
        try:
            if not client.healthy():
                return []
            lost = []
            for name, (e, again) in self._latest.items():
                if not again or e.get("status") == UNLOAD:
                    continue
                if e.get("kind") == "full":
                    if served_base(client, self._hashes).sha256 != e.get("manifest_sha256"):
                        lost.append(e)
                elif client.adapter_root(name) is None:
                    lost.append(e)
            return lost
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


LAKE_ENGINE = ("deltalake", "polars")  # what reading `model_versions` takes (the `stack` extra has them)


def _lake_engine(replica: str) -> bool:
    """True when the lake can be read here. A replica host with only the `serving` extra has no lake engine:
    its loader carries out releases off the models topic, and does not restore from the registry (warned)."""
    import importlib.util

    missing = [m for m in LAKE_ENGINE if importlib.util.find_spec(m) is None]
    if missing:
        log.warning(
            "%s: serving.follow_registry needs %s to read the registry (pip install 'agentlake[stack]'); "
            "this loader follows release commands only",
            replica,
            " and ".join(missing),
        )
    return not missing


def _registry_rows(settings: Settings) -> RegistryRows:
    """The registry's rows, read afresh at each call from the settings' lake."""
    from schemas.lake import Lake
    from trainer.registry import Registry

    def rows() -> list[dict[str, Any]]:
        return Registry(Lake.from_settings(settings)).rows()

    return rows
