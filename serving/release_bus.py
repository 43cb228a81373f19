"""The publisher's side of the release bus: send a release command, wait for every replica's ack.

The command goes to the models topic (serving.releases); each replica's loader (serving.loader) answers
on the acks topic with the command's ``release_id``. The acks topic is read from its beginning and
filtered by that id: the broker's end offsets cannot be trusted on every engine (Tansu reports 1), and
the topic holds one small record per replica per release.

A release worked when every expected replica acked ``ok`` and reports serving the manifest hash the
registry holds; anything else is one error line per replica (its own error, a wrong hash, or silence
until the timeout), which is what the registry records.

A full-weight version restarts each replica's vLLM, so it is never sent to all at once:
``release_serially`` sends one command per replica (``targets`` naming it), waits for that replica's ack,
and only then sends the next; the first replica where it did not hold ends the rollout, and the replicas
after it are named as not sent.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.config import KafkaSettings
from schemas.errors import AgentlakeError
from schemas.kafka import kafka_python_config
from schemas.tables import MODEL_RELEASE_ACK
from schemas.validation import validate_record
from serving.errors import PublishError
from serving.releases import send_release_event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReleaseOutcome:
    """The acks one release command got (replica -> ack), and the replicas that stayed silent."""

    command: dict[str, Any]
    acks: dict[str, dict[str, Any]]
    silent: list[str]
    timeout_s: float
    seconds: float  # from sending the command to the last ack (or the timeout)
    # a serial rollout (release_serially): replica -> why it got no command (the rollout stopped before it,
    # or sending failed); in the order the commands were to go
    skipped: dict[str, str] = field(default_factory=dict)

    def moved(self) -> list[str]:
        """The replicas that acked ok and serve what the command asked for: the ones that changed."""
        errors = self.errors()
        return [r for r, ack in self.acks.items() if ack["ok"] and r not in errors]

    def errors(self) -> dict[str, str]:
        """Replica -> why the release did not hold there; empty when every replica serves the version."""
        want = self.command.get("manifest_sha256")
        out: dict[str, str] = {}
        for replica, ack in sorted(self.acks.items()):
            if not ack["ok"]:
                out[replica] = f"{ack['error']} (serving {ack['serving_version'] or 'nothing'})"
            elif want and ack["serving_sha256"] != want:
                out[replica] = f"acked, but serves manifest {ack['serving_sha256']}, not {want}"
        for replica in self.silent:
            out[replica] = f"no ack within {self.timeout_s:.0f}s (is its loader running?)"
        out.update(self.skipped)
        return out

    def summary(self) -> str:
        """The errors as one line for the registry, or "" when the release held everywhere."""
        return "; ".join(f"replica {r}: {e}" for r, e in self.errors().items())


def release(
    kafka: KafkaSettings, command: dict[str, Any], replicas: Sequence[str], *, timeout_s: float
) -> ReleaseOutcome:
    """Send ``command`` and wait until each of ``replicas`` acked it or ``timeout_s`` passed."""
    t0 = time.perf_counter()
    if err := send_release_event(kafka, command):
        raise PublishError(f"the release command for {command['version']} was not sent: {err}")
    acks = wait_for_acks(kafka, command["release_id"], replicas, timeout_s=timeout_s)
    silent = sorted(set(replicas) - set(acks))
    return ReleaseOutcome(command, acks, silent, timeout_s, time.perf_counter() - t0)


def release_serially(kafka: KafkaSettings, commands: Sequence[dict[str, Any]], *, timeout_s: float) -> ReleaseOutcome:
    """Send ``commands`` (each naming one replica in ``targets``) one at a time: the next only after the
    previous replica acked ok with the asked hash; stop at the first that did not (``timeout_s`` per replica)."""
    t0 = time.perf_counter()
    acks: dict[str, dict[str, Any]] = {}
    silent: list[str] = []
    skipped: dict[str, str] = {}
    for i, command in enumerate(commands):
        (replica,) = command["targets"]
        command = {**command, "timestamp": dt.datetime.now(dt.UTC)}  # when it went: after the previous ack
        try:
            step = release(kafka, command, [replica], timeout_s=timeout_s)
        except PublishError as exc:
            skipped[replica] = str(exc)
            failed = replica
        else:
            acks.update(step.acks)
            silent += step.silent
            if not step.errors():
                continue
            failed = replica
        for later in commands[i + 1 :]:
            skipped[later["targets"][0]] = f"not sent: the rollout stopped at replica {failed}"
        break
    return ReleaseOutcome(commands[0], acks, silent, timeout_s, time.perf_counter() - t0, skipped)


def wait_for_acks(
    kafka: KafkaSettings, release_id: str, replicas: Sequence[str], *, timeout_s: float, poll_ms: int = 100
) -> dict[str, dict[str, Any]]:
    """The acks of ``release_id`` (replica -> its last ack) once every one of ``replicas`` answered, or at
    the timeout with what came."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        **kafka_python_config(kafka, role="consumer"),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=poll_ms,
    )
    acks: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    topic_deadline = time.monotonic() + min(timeout_s, 10.0)  # metadata of an existing topic comes at once
    try:
        while (parts := consumer.partitions_for_topic(kafka.model_acks_topic)) is None:
            if time.monotonic() > topic_deadline:
                raise PublishError(
                    f"the acks topic {kafka.model_acks_topic} does not exist on {kafka.bootstrap_servers}: "
                    "`agentlake up` creates it (kafka.model_acks_topic), or create it as the other topics"
                )
            time.sleep(0.2)
        tps = [TopicPartition(kafka.model_acks_topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while not set(replicas) <= set(acks) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=poll_ms).values():
                for record in records:
                    ack = _ack(record.value)
                    if ack is not None and ack["release_id"] == release_id:
                        acks[ack["replica"]] = ack
    finally:
        consumer.close()
    return acks


def _ack(value: bytes) -> dict[str, Any] | None:
    try:
        return validate_record(json.loads(value), MODEL_RELEASE_ACK)
    except (ValueError, AgentlakeError) as exc:
        log.warning("skipping an unreadable ack: %s", exc)
        return None
