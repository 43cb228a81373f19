"""Differential, property-based test of ingestion by concurrent workers (issue 28, "Ingestion that scales out").

Generated workloads are produced to a real broker, partition by partition, and the offsets the broker
acknowledged are the reference: every acknowledged record's spans once in `spans` (an undecodable one
once in `quarantine`), every partition's watermark at its last acknowledged offset, and no partition's
position ever committed twice or backwards. In between, rounds of two workers on disjoint partition
sets run at once (threads: delta-rs commits off the GIL) on one real Delta table, each stopping after
a drawn number of batches; some rounds add a third run over every partition (it must lose or win
whole batches, never add a row twice) or a table-property change by another writer (a conflict that
is not over the workers' partitions: their commits are retried on the newer snapshot).

``LAKE_TEST_EXAMPLES=N`` runs N examples instead of 10.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipelines.bronze.ingest import ingest
from pipelines.bronze.positions import app_id
from schemas import topics
from schemas.config import KafkaSettings
from schemas.errors import ConcurrentWriteError
from schemas.kafka import kafka_python_config
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, span_record
from tests.topics import fresh_kafka

pytestmark = [pytest.mark.kafka]

EXAMPLES = int(os.environ.get("LAKE_TEST_EXAMPLES", "10"))
PARTITIONS = 4


@dataclass(frozen=True)
class Produced:
    """One record to produce: its partition and what it holds (``calls`` LLM calls, or 0: undecodable)."""

    partition: int
    calls: int


@dataclass(frozen=True)
class Round:
    """Records produced, then one round of two workers at once (and maybe an intruder or a property change)."""

    records: list[Produced]
    split: tuple[int, ...]  # worker A's partitions; worker B owns the rest
    batch_records: int
    max_batches: tuple[int | None, int | None]  # each worker stops after this many batches (None: caught up)
    intruder: bool  # a third run over every partition, at the same time
    alter: bool  # another writer changes a table property meanwhile


_splits = st.sampled_from(
    [(0, 2), (1, 3), (0,), (0, 1, 2), (1,), (3,), (0, 3)]  # p % 2 == 0 first; explicit sets after
)
_rounds = st.builds(
    Round,
    records=st.lists(
        st.builds(Produced, partition=st.integers(0, PARTITIONS - 1), calls=st.sampled_from((0, 1, 1, 2, 3))),
        max_size=24,
    ),
    split=_splits,
    batch_records=st.sampled_from((1, 2, 5, 40)),
    max_batches=st.tuples(*[st.sampled_from((None, None, 1, 2))] * 2),
    intruder=st.booleans(),
    alter=st.integers(0, 3).map(lambda v: v == 0),
)


def _produce(kafka: KafkaSettings, records: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, int]]:
    """Produce each (partition, record) with acks=all; the (partition, offset) the broker acknowledged."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka_python_config(kafka), acks="all", linger_ms=5)
    try:
        futures = [
            producer.send(kafka.spans_topic, partition=p, key=r["key"], value=r["value"], headers=r["headers"])
            for p, r in records
        ]
        producer.flush(30)
        return [(m.partition, m.offset) for m in (f.get(30) for f in futures)]
    finally:
        producer.close()


def _at_once(fns: list[Callable[[], object]]) -> list[object]:
    """Run ``fns`` in threads started together; what each returned, or the ConcurrentWriteError it lost with."""
    start = threading.Barrier(len(fns))
    outcomes: list[object] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait(60)
        try:
            outcomes[i] = fns[i]()
        except ConcurrentWriteError as exc:  # refused before its rows landed: the partitions were taken
            outcomes[i] = exc
        except BaseException as exc:  # anything else fails the test, naming the function that raised it
            errors.append(RuntimeError(f"{getattr(fns[i], '__name__', i)}: {exc!r}"))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return outcomes


def _txn_history(uri: str) -> dict[str, list[int]]:
    """Every value each app transaction was committed with, in commit order."""
    seen: dict[str, list[int]] = {}
    for f in sorted(Path(uri, "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn:
                seen.setdefault(txn["appId"], []).append(txn["version"])
    return seen


def _record(name: str, calls: int) -> tuple[dict[str, Any], list[str]]:
    """A span record and its span ids (hex), or an undecodable record (no spans)."""
    if calls == 0:
        headers = [
            (topics.HEADER_TENANT, b"default"),
            (topics.HEADER_SCHEMA_VERSION, b"1"),
            (topics.HEADER_CONTENT_TYPE, topics.SPANS_CONTENT_TYPE.encode()),
        ]
        return {"key": name.encode(), "value": b"\xffnot an OTLP request", "headers": headers}, []
    spans = make_spans(
        Rollout(name, task_id="t", calls=[Call(prompt=[i], response=[2]) for i in range(calls)], final_reward=1.0)
    )
    return span_record(spans, key=name), [format(s.context.span_id, "016x") for s in spans]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: every example runs a real broker
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)
@given(rounds=st.lists(_rounds, min_size=1, max_size=3))
def test_concurrent_workers_store_every_acknowledged_span_once(
    rounds: list[Round], kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kafka = fresh_kafka(kafka_bootstrap, prefix="workers", partitions=PARTITIONS)
    topic = kafka.spans_topic
    lake = Lake(tempfile.mkdtemp(prefix="workers-", dir=tmp_path_factory.getbasetemp()))
    want_spans: set[tuple[int, int, str]] = set()
    want_bad: set[tuple[int, int]] = set()
    last: dict[int, int] = {}

    def worker(parts: tuple[int, ...] | None, batch: int, max_batches: int | None) -> Callable[[], object]:
        return lambda: (
            ingest(
                lake, kafka, "spans", partitions=parts, batch_records=batch, max_batches=max_batches, workers=0
            ).records
        )

    def alter() -> None:
        # another writer, which (like any Delta writer) tries again when a concurrent commit refused its own
        for attempt in range(5):
            dt = lake.pin("spans")
            try:
                dt.alter.set_table_properties({"agentlake.test.round": str(n)}, raise_if_not_exists=False)
                return
            except CommitFailedError:
                if attempt == 4:
                    raise

    for n, r in enumerate(rounds):
        made = [_record(f"r{n}-{i}", x.calls) for i, x in enumerate(r.records)]
        acked = _produce(kafka, [(x.partition, rec) for x, (rec, _) in zip(r.records, made, strict=True)])
        for (p, off), (_, span_ids) in zip(acked, made, strict=True):
            last[p] = max(last.get(p, -1), off)
            want_spans.update((p, off, s) for s in span_ids)
            if not span_ids:
                want_bad.add((p, off))
        rest = tuple(p for p in range(PARTITIONS) if p not in r.split)
        fns = [worker(r.split, r.batch_records, r.max_batches[0]), worker(rest, r.batch_records, r.max_batches[1])]
        if r.intruder:
            fns.append(worker(None, r.batch_records, None))
        if r.alter:
            fns.append(alter)
        _at_once(fns)
    # the two workers of the last split catch up; whatever another run took from them is there already
    rest = tuple(p for p in range(PARTITIONS) if p not in rounds[-1].split)
    _at_once([worker(rounds[-1].split, 50, None), worker(rest, 50, None)])

    spans = pl.read_delta(lake.uri("spans")).select("kafka_partition", "kafka_offset", "span_id")
    got = {(int(p), int(o), str(s)) for p, o, s in spans.iter_rows()}
    assert spans.height == len(got), f"{spans.height - len(got)} spans stored twice"
    assert got == want_spans, f"missing {sorted(want_spans - got)[:5]}, unexpected {sorted(got - want_spans)[:5]}"
    if want_bad:
        q = pl.read_delta(lake.uri("quarantine")).select("kafka_partition", "kafka_offset")
        bad = {(int(p), int(o)) for p, o in q.iter_rows()}
        assert q.height == len(bad) and bad == want_bad, (sorted(bad), sorted(want_bad))
    dt = DeltaTable(lake.uri("spans"))
    history = _txn_history(lake.uri("spans"))
    for p in range(PARTITIONS):
        assert dt.transaction_version(app_id(topic, p)) == last.get(p), f"partition {p}"
        marks = history.get(app_id(topic, p), [])
        assert marks == sorted(set(marks)), f"partition {p}: a position committed twice or backwards: {marks}"
