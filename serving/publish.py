"""Republish a model version to the running vLLM, record the outcome, announce it on Kafka.

LoRA (the default): ``POST /v1/load_lora_adapter {"lora_name": <served name>, "lora_path":
<the version's own folder>, "load_inplace": true}``; vLLM swaps the adapter between requests, no
restart. A new folder per version matters: vLLM keys loaded adapters by path.

Full weights: vLLM has no stable public endpoint for swapping base weights from a folder, so
this is a managed restart: pause the gateway (requests queue there, agents see latency, not
errors), restart vLLM on the new folder through the ``restart`` callable the caller owns (the CLI
passes one that stops and starts the local vLLM), wait for health, resume the gateway.

Optional evaluation gate: the candidate is loaded under a temporary name and scored next to the
serving version on held-out tasks; it is published only if it is not worse, else ``rejected``. With
replicas the canary replica scores it (serving.canary) before anything is released.

vLLM loads a local folder: each version's comes from ``trainer.artifacts.local_copy`` (the
trainer's own copy, or a download from the lake's object store into ``cache_dir``, verified against
the manifest hash in the registry), so `agentlake model publish|rollback` works on a host that did
not train the version, and a changed or corrupt stored file is refused by name.

Failure: nothing about serving changes (an in-place load that failed is followed by re-loading
the serving version's folder), the row becomes ``failed`` with the error, a ``failed`` release
event goes out, and ``PublishError`` is raised. Rollback re-loads the previous version's folder.

Replicas (``serving.replicas``): the release bus. ``publish`` and ``rollback`` send a ``release`` command
on the models topic and wait for an ack from every replica's loader (serving.release_bus, serving.loader);
the version is ``published`` only if every replica acked ok and serves its manifest hash. Otherwise it is
``failed`` with each replica's error, and a command for the version that was serving brings every
replica back to it; when nothing of the line served before, an ``unload`` command makes the replicas
that took it drop it. Each ack read is kept in ``served_versions`` (serving.served). The trainer then
touches no vLLM itself, and the folders move through the lake's object store. With eval tasks, an
``evaluate`` command goes to the canary first (``serving.canary``); a canary that fails or stays silent
makes the version ``failed``, a worse score ``rejected``, and neither releases anything.

A full-weight version restarts each replica's vLLM (its loader's ``serving.restart_command``, behind its
gateway's pause), so it is rolled out replica by replica, never all at once: one command per replica
(``targets`` naming it), the next only after that replica acked ok (``release_bus.release_serially``).
The first replica where it did not hold ends the rollout: it kept or restored its weights, the replicas
already moved go back to the serving version one at a time (or, on a first publish, unload it), the
replicas after it are named as not sent, and the version is ``failed``. Rollback to a full-weight
version takes the same path.

Policy lines (``trainer.lines``): a version of an agent's line (``model_versions.agent``) is loaded
under that line's name (``agentlake-policy-planner``), compared with, restored to and rolled back to
within its own line; the other lines' adapters are not touched.

Every publish (the ``policy`` asset, `agentlake train --publish`, `agentlake model publish`) builds its
publisher with ``gated_publisher``: the eval gate from ``trainer.eval_tasks`` and a restart for full weights,
so the three cannot drift apart.

The parts it calls live apart: serving.vllm_client (the vLLM endpoints), serving.eval_gate (the
held-out tasks and their score), serving.gateway_pause and serving.releases (the Kafka event).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.config import KafkaSettings, Settings
from schemas.config.serving import policy_served_name
from schemas.lake import Lake
from serving.canary import ask_canary
from serving.errors import PublishError
from serving.eval_gate import EvalTask, GateScores, candidate_name, compare, load_eval_tasks, worse
from serving.evaluation_table import Scored, try_record
from serving.gateway_pause import GATEWAY_PAUSE, GATEWAY_RESUME, gateway_call
from serving.release_bus import ReleaseOutcome, release, release_serially
from serving.releases import release_command, release_event, send_release_event, unload_command
from serving.restart import command_restart
from serving.served import record_acks
from serving.vllm_client import VllmClient
from trainer.artifacts import local_copy
from trainer.errors import ArtifactError, RegistryError
from trainer.registry import Registry

log = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass
class PublishResult:
    version: str
    status: str  # published | rejected | rolled_back
    seconds: float
    previous: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    event_error: str | None = None
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)  # replica -> its ack (the release bus)
    bus_seconds: float | None = None  # release command sent -> last replica's ack
    # the gate's paired comparison (serving.evaluation): eval_diff, eval_diff_ci_low, eval_diff_ci_high, eval_verdict
    comparison: dict[str, float | str] = field(default_factory=dict)


@dataclass
class Publisher:
    """Where versions go: one vLLM, one served name (``served_name``, plus ``-<agent>`` for a line's
    versions), optional gateway and Kafka."""

    registry: Registry
    vllm_url: str
    served_name: str
    gateway_url: str | None = None
    gateway_headers: Mapping[str, str] = field(default_factory=dict)  # the admin token, when one is set
    kafka: KafkaSettings | None = None
    restart: Callable[[str], None] | None = None  # full weights: restart vLLM on this folder
    eval_tasks: Sequence[EvalTask] = ()
    timeout_s: float = 120.0
    cache_dir: Path = Path(".agentlake/models")  # where versions fetched from the lake are kept
    api_key: str = ""  # vLLM's --api-key, sent as a bearer token
    replicas: Sequence[str] = ()  # non-empty: publish through the release bus to these loaders
    ack_timeout_s: float = 120.0
    canary: str = ""  # the replica that scores candidates on eval_tasks (empty: replicas[0]; serving.canary)
    eval_confidence: float = 0.95  # serving.eval_gate_confidence: reject only what is worse beyond noise
    eval_task_set: str = "eval_tasks"  # the name the `evaluations` table gives eval_tasks (the file's)

    @classmethod
    def from_settings(cls, settings: Settings, *, vllm_url: str | None = None, **kwargs: Any) -> Publisher:
        from trainer.config import local_model_dir

        gw = settings.gateway
        kwargs.setdefault("cache_dir", local_model_dir(settings))
        return cls(
            registry=Registry(Lake.from_settings(settings)),
            vllm_url=vllm_url or settings.vllm.url,
            served_name=settings.model.served_name,
            gateway_url=gw.url,
            gateway_headers=gw.admin_headers(),
            kafka=settings.kafka,
            api_key=settings.vllm.api_key(),
            replicas=tuple(settings.serving.replicas),
            ack_timeout_s=settings.serving.ack_timeout_s,
            canary=settings.serving.canary_replica(),
            eval_confidence=settings.serving.eval_gate_confidence,
            **kwargs,
        )

    def name_of(self, row: dict[str, Any]) -> str:
        """The name a version is served under: its line's."""
        return policy_served_name(self.served_name, row.get("agent"))

    def publish(self, version: str) -> PublishResult:
        """Make ``version`` the served one of its line, or leave serving as it was and record why not."""
        row = self.registry.get(version)
        serving = self.registry.serving(agent=row.get("agent"))
        if self.replicas:
            return self._publish_bus(row, serving)
        name = self.name_of(row)
        client = self._client()
        t0 = time.perf_counter()
        scores: GateScores | None = None
        try:
            folder = self.local_folder(row)
            if row["kind"] == "lora":
                self._check_adapter(client, folder, name)
                if self.eval_tasks:
                    scores = self._evaluate(client, row, folder, serving)
                    self._record_eval(row, serving, scores, source="gate")
                    if worse(scores, self.eval_confidence):
                        return self._finish(
                            row, "rejected", t0, serving, scores, error="worse than serving beyond noise"
                        )
                client.load_lora(name, folder, inplace=True)
            else:
                self._publish_full(client, folder)
        except PublishError as exc:
            self._restore(client, row, serving)
            self._finish(row, "failed", t0, serving, scores, error=str(exc))
            raise
        finally:
            client.close()
        return self._finish(row, "published", t0, serving, scores)

    def rollback(self, to_version: str | None = None, *, agent: str | None = None) -> PublishResult:
        """Serve an earlier version of a line again (default: the one published before the serving one).

        The line is ``to_version``'s when one is named, else ``agent``'s (None: the single policy)."""
        if to_version is not None:
            agent = self.registry.get(to_version).get("agent")
        current = self.registry.serving(agent=agent)
        if current is None:
            line = f" in {agent!r}'s policy line" if agent else ""
            raise RegistryError(f"nothing is published{line}, so there is nothing to roll back")
        if to_version is None:
            earlier = [
                r
                for r in self.registry.rows()
                if r["published_at"] is not None
                and r["version"] != current["version"]
                and r["agent"] == agent
                and r["publish_status"] in ("published", "rolled_back")
                and r["published_at"] < current["published_at"]
            ]
            if not earlier:
                raise RegistryError(f"{current['version']} is the first published version; no earlier one to serve")
            to_version = max(earlier, key=lambda r: r["published_at"])["version"]
        target = self.registry.get(to_version)
        if self.replicas:
            return self._rollback_bus(current, target)
        client = self._client()
        t0 = time.perf_counter()
        try:
            folder = self.local_folder(target)
            if target["kind"] == "lora":
                client.load_lora(self.name_of(target), folder, inplace=True)
            else:
                self._publish_full(client, folder)
        except PublishError as exc:
            self.registry.set_status(current["version"], "published", error=f"rollback failed: {exc}")
            raise
        finally:
            client.close()
        return self._rolled_back(current, to_version, t0)

    def _rolled_back(self, current: dict[str, Any], to_version: str, t0: float) -> PublishResult:
        """Record and announce that ``to_version`` serves again in place of ``current``."""
        now = dt.datetime.now(dt.UTC)
        self.registry.set_status(current["version"], "rolled_back", error=f"rolled back to {to_version}")
        self.registry.set_status(to_version, "published", published_at=now)
        err = send_release_event(self.kafka, release_event(current, "rolled_back", served_name=self.name_of(current)))
        return PublishResult(to_version, "rolled_back", time.perf_counter() - t0, current["version"], event_error=err)

    # -- the release bus -------------------------------------------------------------------------
    def _release(self, row: dict[str, Any], *, to: Sequence[str] | None = None, unload: bool = False) -> ReleaseOutcome:
        """Send ``row`` to the replicas (``to``, default all) and keep the acks in ``served_versions``: a LoRA
        adapter to all at once, full weights one replica at a time (each restarts its vLLM), stopping at the
        first failure. ``unload``: the command drops what the replicas serve under the row's name instead."""
        if self.kafka is None:
            raise PublishError("serving.replicas is set but no Kafka is configured: the release bus runs on Kafka")
        if not unload and (not row.get("artifact_uri") or not row.get("manifest_sha256")):
            raise PublishError(f"{row['version']} has no stored artifact for replicas to fetch; train a new version")
        replicas = list(self.replicas if to is None else to)
        make = unload_command if unload else release_command
        if row["kind"] == "full":
            commands = [make(row, served_name=self.name_of(row), targets=[r]) for r in replicas]
            outcome = release_serially(self.kafka, commands, timeout_s=self.ack_timeout_s)
        else:
            targets = [] if to is None else replicas
            command = make(row, served_name=self.name_of(row), targets=targets)
            outcome = release(self.kafka, command, replicas, timeout_s=self.ack_timeout_s)
        try:
            record_acks(self.registry.lake, outcome.acks.values())
        except Exception as exc:  # the record is a view of the acks; serving is what it is
            log.warning("could not record the acks of %s in served_versions: %s", row["version"], exc)
        return outcome

    def _publish_bus(self, row: dict[str, Any], serving: dict[str, Any] | None) -> PublishResult:
        t0 = time.perf_counter()
        scores: GateScores | None = None
        if self.eval_tasks:  # the gate, on the canary replica: nothing is released before it scored
            canary = self.canary or self.replicas[0]
            name, tasks = self.name_of(row), self.eval_tasks
            verdict = ask_canary(
                self.kafka, row, served_name=name, tasks=tasks, canary=canary, timeout_s=self.ack_timeout_s
            )
            scores = verdict.scores
            if verdict.error or scores is None:
                self._finish(row, "failed", t0, serving, scores, error=verdict.error)
                raise PublishError(f"{row['version']} was not published: {verdict.error}")
            self._record_eval(row, serving, scores, source="canary")
            if worse(scores, self.eval_confidence):
                return self._finish(
                    row, "rejected", t0, serving, scores, error=f"worse than serving beyond noise on {canary}"
                )
        outcome, error = self._try_release(row)
        if outcome is not None and not error:
            result = self._finish(row, "published", t0, serving, scores)
            result.acks, result.bus_seconds = outcome.acks, outcome.seconds
            return result
        if outcome is not None and (serving is None or serving["version"] != row["version"]):
            self._bus_restore(row, serving, outcome)  # a command went out: replicas that took it go back
        self._finish(row, "failed", t0, serving, scores, error=error)
        raise PublishError(f"{row['version']} was not published: {error}")

    def _try_release(self, row: dict[str, Any]) -> tuple[ReleaseOutcome | None, str]:
        """The release's outcome and its errors as one line ("" when it held on every replica)."""
        try:
            outcome = self._release(row)
        except PublishError as exc:
            return None, str(exc)
        return outcome, outcome.summary()

    def _bus_restore(self, failed: dict[str, Any], serving: dict[str, Any] | None, outcome: ReleaseOutcome) -> None:
        """After ``failed`` did not hold, bring the replicas back to ``serving`` (None: the line's first
        publish, so they unload it). A LoRA release went to every replica, and every replica gets the
        serving version again (those that kept it answer at once); a full-weight rollout touched only the
        replicas it reached, so only those go back, one at a time. Between kinds, a replica first drops
        what it took (an unload: back to the base model, or no adapter), then gets the serving version."""
        if failed["kind"] == "full":
            touched = [r for r in self.replicas if r in outcome.acks or r in outcome.silent]
        else:
            touched = list(self.replicas)
        if not touched:
            return  # no replica got the command: nothing moved
        steps: list[tuple[dict[str, Any], bool]] = []
        if serving is None or serving["kind"] != failed["kind"]:
            steps.append((failed, True))  # drop the failed kind first: another kind does not replace it
        if serving is not None:
            steps.append((serving, False))
        for row, unload in steps:
            what = "unload" if unload else row["version"]
            try:
                to = None if failed["kind"] != "full" and row["kind"] != "full" else touched
                if back := self._release(row, to=to, unload=unload).summary():
                    log.warning("replicas not back (%s): %s", what, back)
            except PublishError as exc:
                log.warning("could not send replicas back (%s): %s", what, exc)

    def _rollback_bus(self, current: dict[str, Any], target: dict[str, Any]) -> PublishResult:
        t0 = time.perf_counter()
        outcome, error = self._try_release(target)
        if outcome is None or error:
            if outcome is not None:
                self._bus_restore(target, current, outcome)
            self.registry.set_status(current["version"], "published", error=f"rollback failed: {error}")
            raise PublishError(f"rollback to {target['version']} failed: {error}")
        result = self._rolled_back(current, target["version"], t0)
        result.acks, result.bus_seconds = outcome.acks, outcome.seconds
        return result

    # -- steps ----------------------------------------------------------------------------------
    def _client(self) -> VllmClient:
        return VllmClient(self.vllm_url, timeout_s=self.timeout_s, api_key=self.api_key)

    def local_folder(self, row: dict[str, Any]) -> str:
        """The version's folder on this machine, fetched from the lake and verified when it is not here."""
        try:
            return str(local_copy(row, cache_dir=self.cache_dir, storage_options=self.registry.lake.storage_options))
        except ArtifactError as exc:
            raise PublishError(str(exc)) from exc

    def _check_adapter(self, client: VllmClient, folder: str, name: str) -> None:
        """Fail early, before vLLM is touched, on a missing folder or a shadowed served name."""
        missing = [f for f in ADAPTER_FILES if not (Path(folder) / f).exists()]
        if missing:
            raise PublishError(f"{folder} lacks {', '.join(missing)}; is it a LoRA checkpoint?")
        for m in client.models():
            if m.get("id") == name and not m.get("parent"):
                raise PublishError(
                    f"vLLM serves its base model as {name!r}, which would shadow an adapter of "
                    "that name; set model.base_served_name (vLLM's --served-model-name) to another name"
                )

    def _record_eval(
        self, row: dict[str, Any], serving: dict[str, Any] | None, scores: GateScores, *, source: str
    ) -> None:
        """The candidate's evaluation against what serves, in the `evaluations` table (best effort)."""
        paired = scores.paired(self.eval_confidence)
        scored = Scored(
            row["version"],
            paired.after,
            baseline_version=serving["version"] if serving else "base",
            baseline_mean=paired.before.mean,
            diff=paired.diff,
            verdict=paired.verdict,
        )
        try_record(
            self.registry.lake,
            [scored],
            task_set=self.eval_task_set,
            n_tasks=paired.n_tasks,
            n_samples=1,  # the gate's completions are greedy: one per task
            confidence=self.eval_confidence,
            source=source,
            agent=row.get("agent"),
        )

    def _evaluate(
        self, client: VllmClient, row: dict[str, Any], folder: str, serving: dict[str, Any] | None
    ) -> GateScores:
        candidate = candidate_name(self.name_of(row), row["version"])
        baseline = self.name_of(row) if serving is not None else None  # None: the base model
        return compare(client, candidate=candidate, folder=folder, baseline=baseline, tasks=self.eval_tasks)

    def _publish_full(self, client: VllmClient, folder: str) -> None:
        if self.restart is None:
            raise PublishError(
                "a full-weight version needs a managed vLLM restart; publish it with "
                "`agentlake model publish`, which restarts the local vLLM on the new folder"
            )
        paused = gateway_call(self.gateway_url, GATEWAY_PAUSE, headers=self.gateway_headers)
        try:
            self.restart(folder)
            deadline = time.monotonic() + self.timeout_s
            while not client.healthy():
                if time.monotonic() > deadline:
                    raise PublishError(f"vLLM did not come back within {self.timeout_s:.0f}s on {folder}")
                time.sleep(0.5)
        finally:
            if paused:
                gateway_call(self.gateway_url, GATEWAY_RESUME, headers=self.gateway_headers)

    def _restore(self, client: VllmClient, row: dict[str, Any], serving: dict[str, Any] | None) -> None:
        """After a failed in-place load, put the serving adapter back (a no-op when it never left)."""
        if row["kind"] != "lora" or serving is None or serving["kind"] != "lora":
            return
        try:
            client.load_lora(self.name_of(serving), self.local_folder(serving), inplace=True)
        except PublishError as exc:
            log.warning("could not re-load serving version %s: %s", serving["version"], exc)

    def _finish(
        self,
        row: dict[str, Any],
        status: str,
        t0: float,
        serving: dict[str, Any] | None,
        scores: GateScores | None,
        *,
        error: str | None = None,
    ) -> PublishResult:
        seconds = time.perf_counter() - t0
        now = dt.datetime.now(dt.UTC)
        metrics: dict[str, Any] = {"publish_seconds": round(seconds, 4)}
        means = scores.means() if scores is not None else {}
        metrics.update({f"eval_{k}": v for k, v in means.items()})
        comparison: dict[str, float | str] = {}
        if scores is not None:
            paired = scores.paired(self.eval_confidence)
            comparison = {
                "eval_diff": paired.diff.mean,
                "eval_diff_ci_low": paired.diff.low,
                "eval_diff_ci_high": paired.diff.high,
                "eval_verdict": paired.verdict,
            }
            metrics.update(comparison)
        self.registry.set_status(
            row["version"],
            status,  # type: ignore[arg-type]
            error=error,
            published_at=now if status == "published" else None,
            metrics=metrics,
        )
        err = None
        if status in ("published", "failed"):
            err = send_release_event(self.kafka, release_event(row, status, served_name=self.name_of(row), error=error))
        return PublishResult(
            row["version"],
            status,
            seconds,
            serving["version"] if serving else None,
            means,
            event_error=err,
            comparison=comparison,
        )


def gated_publisher(
    settings: Settings,
    *,
    restart: Callable[[str], None] | None = None,
    eval_tasks: str | Path | None = None,
    vllm_url: str | None = None,
) -> Publisher:
    """The publisher of every publish: gated on held-out tasks and able to restart vLLM on full weights.

    ``eval_tasks`` is a JSONL file of tasks (default ``trainer.eval_tasks``; neither: no gate). ``restart`` is the
    caller's way to restart vLLM on a folder (the CLI's restarts the vLLM its stack manages); without one,
    ``vllm.restart_command`` (empty: full-weight versions cannot be published). A bad tasks file or restart
    command is a ``PublishError`` here, before anything is loaded."""
    return Publisher.from_settings(
        settings,
        vllm_url=vllm_url,
        eval_tasks=load_eval_tasks(eval_tasks or settings.trainer.eval_tasks),
        eval_task_set=Path(eval_tasks or settings.trainer.eval_tasks or "eval_tasks").name,
        restart=restart or command_restart(settings.vllm.restart_command),
    )
