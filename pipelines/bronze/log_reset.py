"""A log that went back (a broker that lost its log, a recreated topic) is detected, never skipped.

Each commit records a fingerprint of the record at the watermark (`pipelines.bronze.positions`), and a run
reads from that record and compares it before its first batch (``batches(verify=...)`` in
`pipelines.bronze.fetch`; ``check_log`` here reads it apart to say why when that fails). A missing or different
record stops the run (``LogResetError``) until the new log is accepted (``agentlake lake accept-reset``, or
``ingest(on_reset="accept")``): that commits a new epoch (``kafka-epoch:<topic>``) and, per reset partition, a
base (``kafka-base:<topic>:<partition>``, one past the last offset the lake holds), and records of the new log
are stored at offset + base. So ``kafka_offset`` in the tables is the lake's position in a partition: the Kafka
offset until a reset is accepted, the Kafka offset + base after. It only grows, and the watermarks with it, so
every downstream offset range (``kafka_offset`` between two watermarks) stays correct.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Literal

import polars as pl

from pipelines.bronze.decoders import decode_batch
from pipelines.bronze.decoding import KafkaRecord
from pipelines.bronze.fetch import make_fetcher, topic_partitions
from pipelines.bronze.positions import Kind, Position, app_id, base_id, epoch_id, positions, record_fingerprint
from schemas.config import KafkaSettings
from schemas.errors import LakeError
from schemas.lake import Lake
from schemas.tables import TABLES

OnReset = Literal["stop", "accept"]

ACCEPT_RESET_HINT = (
    "Nothing was written. To ingest the broker's new log from its first record, run "
    "`agentlake lake accept-reset` (it records a new epoch in the table's history; records "
    "already in the lake stay); to keep waiting for the old log instead, restore the broker's log"
)


Probe = tuple[Literal["record"], KafkaRecord] | tuple[Literal["end"], int]


def _probe(
    consumer: Any, topic: str, seeks: dict[int, int | None], targets: dict[int, int], timeout_s: float
) -> dict[int, Probe]:
    """Per partition, read from ``seeks`` (None: the beginning) to the first record at or after ``targets``.

    Gives ``("record", rec)`` (Kafka offsets) or ``("end", next_offset)`` when the log ends first;
    a partition that answered neither within ``timeout_s`` is left out. Tansu answers a fetch past
    its log's end with nothing at all, Kafka with out-of-range (librdkafka then restarts from the
    earliest record, which this reads through to the end).
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if s is None else s) for p, s in seeks.items()])
    found: dict[int, Probe] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < len(seeks) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=500, timeout=0.1):
                p = m.partition()
                if p in found or p not in seeks:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        found[p] = ("end", m.offset())
                    elif err.code() != KafkaError._AUTO_OFFSET_RESET:  # reported before the restart
                        raise KafkaException(err)
                    continue
                if m.offset() >= targets[p]:
                    ts_type, ts = m.timestamp()
                    rec = KafkaRecord(
                        topic, p, m.offset(), m.key(), m.value(), m.headers() or (), ts if ts_type else None
                    )
                    found[p] = ("record", rec)
    finally:
        consumer.unassign()
    return found


def log_ends(consumer: Any, topic: str, parts: list[int], timeout_s: float) -> dict[int, int]:
    """Each partition's end (high watermark) as the broker reports it within ``timeout_s`` in all; a
    partition it does not answer for in that time is left out."""
    from confluent_kafka import KafkaException, TopicPartition

    ends: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    for p in parts:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            _, ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=left)
        except KafkaException:
            continue
    return ends


def check_log(
    consumer: Any,
    topic: str,
    pos: dict[int, Position],
    *,
    legacy: Callable[[KafkaRecord, Position], bool] | None = None,
    timeout_s: float = 5.0,
) -> dict[int, str]:
    """Partitions whose log no longer holds the record at the lake's watermark, each with what the broker has.

    The record at each watermark is read back and compared with the fingerprint committed with
    the watermark (``legacy`` compares it with the rows instead, for watermarks from before
    fingerprints). Raises ``LakeError`` when the broker answers nothing at all for a partition.
    """
    targets = {p: k for p, x in pos.items() if (k := x.kafka_last) is not None}
    if not targets:
        return {}
    # A healthy broker answers within a fetch wait. A silent partition whose log the broker says goes
    # past the watermark holds its record: a busy broker gets the whole wait to send it (read from the
    # beginning instead, a deep partition could not be read through in time). Past the end of a shorter
    # log Tansu answers nothing, and its s3 engine reports an end of 1 whatever it holds: a partition
    # whose end is not past the watermark is read from its beginning up to the watermark.
    found = _probe(consumer, topic, dict(targets), targets, min(1.0, timeout_s))
    silent = {p: k for p, k in targets.items() if p not in found}
    if silent:
        ends = log_ends(consumer, topic, list(silent), timeout_s)
        held = {p: k for p, k in silent.items() if ends.get(p, 0) > k}
        if held:
            found.update(_probe(consumer, topic, dict(held), held, timeout_s))
        unsure = {p: k for p, k in silent.items() if p not in held}
        if unsure:
            found.update(_probe(consumer, topic, dict.fromkeys(unsure), unsure, timeout_s))
    problems: dict[int, str] = {}
    for p, k in targets.items():
        x = pos[p]
        where = f"partition {p}: the lake holds offsets up to {x.watermark}" + (
            f" (Kafka offset {k} of this log)" if x.base else ""
        )
        got = found.get(p)
        if got is None:
            raise LakeError(
                f"{topic} {where}, and the broker returned neither that record nor the end of the log "
                f"within {timeout_s:.0f}s; is it up? Nothing was written"
            )
        if got[0] == "end":
            end = got[1]
            has = "is empty" if end == 0 else f"ends at offset {end - 1}"
            problems[p] = f"{where}, the broker's log {has}"
            continue
        rec = got[1]
        if rec.offset > k:
            problems[p] = f"{where}, the broker's log has no offset {k} (its next record is at {rec.offset})"
            continue
        lake_rec = rec._replace(offset=rec.offset + x.base)
        same = (
            record_fingerprint(rec) == x.fingerprint
            if x.fingerprint is not None
            else legacy is None or legacy(lake_rec, x)
        )
        if not same:
            when = f" written at {rec.timestamp_ms} ms" if rec.timestamp_ms is not None else ""
            problems[p] = f"{where}, the broker has a different record at offset {k}{when}"
    return problems


def legacy_match(lake: Lake, kind: Kind, data_dt: Any) -> Callable[[KafkaRecord, Position], bool]:
    """Compare a record with the rows the lake holds for its offset (watermarks without a fingerprint)."""

    def match(rec: KafkaRecord, _: Position) -> bool:
        rows, bad = decode_batch(kind, [rec])
        at = (
            (pl.col("kafka_topic") == rec.topic)
            & (pl.col("kafka_partition") == rec.partition)
            & (pl.col("kafka_offset") == rec.offset)
        )
        q = lake.scan("quarantine")
        held_bad = [] if q is None else q.filter(at).select("value").collect()["value"].to_list()
        if bad:
            return rec.value in held_bad
        cols = ["trace_id", "span_id"] if kind == "spans" else ["reward_id", "value"]
        held = pl.scan_delta(data_dt).filter(at).select(cols).collect().sort(cols)
        new = pl.from_arrow(rows.select(cols))
        assert isinstance(new, pl.DataFrame)
        return held.equals(new.sort(cols)) and not held_bad

    return match


def accept_new_log(
    lake: Lake, kind: Kind, topic: str, data_dt: Any, pos: dict[int, Position], problems: dict[int, str], epoch: int
) -> dict[str, Any]:
    """Commit a new epoch: each reset partition continues at one past every lake offset it holds."""
    q = lake.table("quarantine")
    reset: dict[str, Any] = {}
    marks = {epoch_id(topic): epoch + 1}
    for p in sorted(problems):
        x = pos[p]
        held = [
            w for w in (x.watermark, None if q is None else q.transaction_version(app_id(topic, p))) if w is not None
        ]
        base = max(held) + 1
        marks[base_id(topic, p)] = base
        reset[str(p)] = {"watermark": x.watermark, "base": base, "broker": problems[p]}
    record = {"topic": topic, "epoch": epoch + 1, "partitions": reset}
    version = lake.write(
        kind,
        TABLES[kind].empty_table(),
        marks=marks,
        expect={app_id(topic, p): pos[p].watermark for p in problems},
        snapshot=data_dt,
        metadata={"agentlake.operation": "accept-reset", "agentlake.reset": json.dumps(record, sort_keys=True)},
    )
    return {**record, "version": version}


def accept_reset(
    lake: Lake, kafka: KafkaSettings, kind: Kind, *, consumer: Any | None = None, timeout_s: float = 10.0
) -> dict[str, Any] | None:
    """Accept the new log of ``kind``'s topic after a reset: what was recorded, or None when the log was not reset.

    Checks the log as ingestion does (so a log that still holds the lake's records is never
    re-read) and commits, into the table, a new epoch and a base per reset partition, with the
    details in the commit's metadata (``agentlake.reset``). The next ingestion reads those
    partitions from their first record, stored at offset + base.
    """
    topic = kafka.spans_topic if kind == "spans" else kafka.rewards_topic
    dt = lake.table(kind)
    if dt is None:
        return None
    own = consumer is None
    consumer = consumer or make_fetcher(kafka)
    try:
        parts = topic_partitions(consumer, topic)
        epoch, pos = positions(dt, topic, parts)
        problems = check_log(consumer, topic, pos, legacy=legacy_match(lake, kind, dt), timeout_s=timeout_s)
        if not problems:
            return None
        return accept_new_log(lake, kind, topic, dt, pos, problems, epoch)
    finally:
        if own:
            consumer.close()
