"""kill -9 of an ingesting process, then a rerun: no duplicate span, no missing record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from pipelines.bronze.ingest import ingest
from schemas.config import Settings
from schemas.lake import Lake
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record

pytestmark = pytest.mark.kafka

N_ROLLOUTS = 600

CHILD = """
import sys, time
from pipelines.bronze.ingest import ingest
from schemas.lake import Lake
from schemas.config import KafkaSettings
kafka = KafkaSettings.model_validate_json(sys.argv[2])
# small batches and a pause after each commit, so the kill lands between and during commits
ingest(Lake(sys.argv[1]), kafka, "spans", batch_records=25, on_commit=lambda v: time.sleep(0.02))
"""


def test_kill_9_mid_ingest_then_rerun(settings: Settings) -> None:
    k = settings.kafka
    records, n_spans = [], 0
    for i in range(N_ROLLOUTS):
        spans = make_spans(Rollout(f"k{i}", task_id="t", calls=[Call(prompt=[1], response=[2])], final_reward=1.0))
        n_spans += len(spans)
        records.append(span_record(spans, key=f"k{i}"))
    produce(k, k.spans_topic, records)
    lake = Lake(settings.lake.root)

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", CHILD, lake.root, k.model_dump_json()], env=env)
    deadline = time.monotonic() + 120
    while (lake.version("spans") or 0) < 3:
        assert child.poll() is None, "ingestion ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.13)  # land somewhere inside a later batch
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    partial = pl.read_delta(lake.uri("spans")).height
    assert 0 < partial < n_spans, "the kill must interrupt ingestion midway"

    ingest(lake, k, "spans", batch_records=500)
    spans = pl.read_delta(lake.uri("spans"))
    assert spans.height == n_spans
    assert spans.select(pl.struct("trace_id", "span_id").n_unique()).item() == n_spans
    # every record offset of every partition is there once: no gap
    per_part = spans.group_by("kafka_partition").agg(
        pl.col("kafka_offset").n_unique().alias("n"), pl.col("kafka_offset").max().alias("hi")
    )
    assert per_part["n"].sum() == N_ROLLOUTS
    assert (per_part["n"] == per_part["hi"] + 1).all()
