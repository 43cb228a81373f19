"""Concurrent writers to one Delta table on the object store (SeaweedFS): no lost commit, no duplicate.

What makes it safe, found here with deltalake 1.6.6 and SeaweedFS 4.48: delta-rs commits
``_delta_log/<version>.json`` as a create-only put (object_store's ``PutMode::Create``, sent as
``If-None-Match: *`` with ``AWS_CONDITIONAL_PUT=etag``, the default the lake's options spell out). Of
two writers racing for one version, the store answers exactly one 200 and the other 412, and delta-rs
retries the loser on top of the winner. With conditional put disabled delta-rs refuses to commit at
all; ``AWS_S3_ALLOW_UNSAFE_RENAME`` no longer changes the commit path in 1.x.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import multiprocessing
import threading
import uuid
from typing import Any

import httpx
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from agentlake.stack import objectstore
from pipelines.bronze.ingest import ingest
from pipelines.bronze.positions import app_id
from schemas.config import Settings
from schemas.lake import Lake
from schemas.tables import SPANS
from tests.objectstore import ObjectStore
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record
from tests.pipelines.test_ingest_concurrent import assert_snapshot_rules

ROUNDS = 25
ROWS = 10


def _signed(method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None) -> dict[str, str]:
    """AWS SigV4 headers for one request with the store's identity (the store refuses unsigned ones)."""
    now = datetime.datetime.now(datetime.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host, path = url.split("://", 1)[1].split("/", 1)
    digest = hashlib.sha256(body).hexdigest()
    signed = {"host": host, "x-amz-date": stamp, "x-amz-content-sha256": digest}
    signed.update({k.lower(): v for k, v in (headers or {}).items()})
    names = sorted(signed)
    canonical = "\n".join(
        [method, "/" + path, "", "".join(f"{n}:{signed[n]}\n" for n in names), ";".join(names), digest]
    )
    scope = f"{day}/{objectstore.REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + objectstore.SECRET_KEY).encode()
    for part in (day, objectstore.REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={objectstore.ACCESS_KEY}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signed


@pytest.mark.slow  # racing writers on the object store: ~9 s
def test_the_store_lets_one_create_only_put_win(object_store: ObjectStore) -> None:
    """The property delta-rs's commits rely on: of racing ``If-None-Match: *`` PUTs exactly one lands."""
    for _ in range(5):
        url = f"{object_store.endpoint}/{objectstore.LAKE_BUCKET}/race/{uuid.uuid4().hex}.json"
        start, codes = threading.Barrier(8), {}

        def put(i: int, url: str = url, start: threading.Barrier = start, codes: dict = codes) -> None:
            body = f"writer {i}".encode()
            headers = _signed("PUT", url, body, {"If-None-Match": "*"})
            start.wait()
            codes[i] = httpx.put(url, content=body, headers=headers, timeout=30).status_code

        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [i for i, code in codes.items() if code == 200]
        assert len(winners) == 1 and sorted(codes.values()) == [200] + [412] * 7, codes
        stored = httpx.get(url, headers=_signed("GET", url), timeout=30).text
        assert stored == f"writer {winners[0]}", "the winner's commit is the one stored"


def _schema() -> pa.Schema:
    return pa.schema([("writer", pa.int64()), ("round", pa.int64()), ("i", pa.int64())])


def _append_rounds(uri: str, options: dict[str, str], writer: int, rounds: int, out: Any, go: Any) -> None:
    """One writer process: ``rounds`` appends, each through its own DeltaTable; the versions it committed
    go on ``out``. It says it is ready and waits for ``go``: a spawned process's imports take seconds under
    load, and without the handshake one writer once finished all its rounds before the other began."""
    out.put(("ready", writer))
    if not go.wait(300):
        return
    versions = []
    for r in range(rounds):
        table = DeltaTable(uri, storage_options=options)
        data = pa.table({"writer": [writer] * ROWS, "round": [r] * ROWS, "i": list(range(ROWS))}, schema=_schema())
        write_deltalake(table, data, mode="append")
        versions.append(table.version())
    out.put(("done", writer, versions))


def _in_processes(uri: str, options: dict[str, str]) -> tuple[list[int], list[int]]:
    """Both writers at once, each in a spawned process (delta-rs's runtime does not survive fork), let go
    together once both are ready; killed if still there after their results came or the time ran out.
    Every wait has a timeout (a `Manager` barrier once hung a suite for 10 minutes), and not a
    `multiprocessing.Pool`: its teardown once waited forever on a worker that would not exit."""
    ctx = multiprocessing.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_append_rounds, args=(uri, options, w, ROUNDS, out, go)) for w in range(2)]
    for p in procs:
        p.start()
    try:
        ready = [out.get(timeout=300) for _ in procs]
        assert sorted(m[1] for m in ready) == [0, 1], ready
        go.set()
        got = {m[1]: m[2] for m in (out.get(timeout=600) for _ in procs)}
    finally:
        go.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
    return got[0], got[1]


def test_two_processes_append_to_one_table(object_store: ObjectStore) -> None:
    uri, options = object_store.lake_root() + "/race", object_store.storage_options
    assert options["AWS_CONDITIONAL_PUT"] == "etag"
    write_deltalake(uri, _schema().empty_table(), storage_options=options)
    first, second = _in_processes(uri, options)

    assert max(first) > min(second) and max(second) > min(first), "the writers did overlap"
    assert sorted(first + second) == list(range(1, 2 * ROUNDS + 1)), "each commit got its own version, none lost"
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2 * ROUNDS
    rows = table.to_pyarrow_table()
    assert rows.num_rows == 2 * ROUNDS * ROWS
    seen = {(w, r) for w, r in zip(rows["writer"].to_pylist(), rows["round"].to_pylist(), strict=True)}
    assert seen == {(w, r) for w in range(2) for r in range(ROUNDS)}
    appends = [h for h in table.history() if h["operation"] == "WRITE" and h["version"] > 0]
    assert len(appends) == 2 * ROUNDS


def test_commits_need_conditional_put(object_store: ObjectStore) -> None:
    """Without it delta-rs 1.x refuses to commit on S3, so the safe option is the one in use."""
    uri = object_store.lake_root() + "/unsafe"
    options = {**object_store.storage_options, "AWS_CONDITIONAL_PUT": "disabled"}
    with pytest.raises(OSError, match="conditional put is disabled"):
        write_deltalake(uri, _schema().empty_table(), storage_options=options)


def test_snapshot_pinned_commits_on_the_object_store(object_store: ObjectStore) -> None:
    """``Lake.write``'s rules (tests/pipelines/test_ingest_concurrent.py) hold on s3 as on a folder."""
    lake = Lake(object_store.lake_root(), object_store.storage_options)
    assert_snapshot_rules(lake, SPANS.empty_table())


@pytest.mark.kafka
def test_two_ingestions_at_once_on_the_object_store(settings: Settings, object_store: ObjectStore) -> None:
    from tests.pipelines.test_ingest_concurrent import _race

    k, n_records, n_spans = settings.kafka, 300, 0
    records = []
    for i in range(n_records):
        spans = make_spans(Rollout(f"c{i}", task_id="t", calls=[Call(prompt=[i], response=[2])], final_reward=1.0))
        n_spans += len(spans)
        records.append(span_record(spans, key=f"c{i}"))
    produce(k, k.spans_topic, records)
    lake = Lake(object_store.lake_root(), object_store.storage_options)
    _race(lambda: ingest(lake, k, "spans", batch_records=40, workers=0).records)
    ingest(lake, k, "spans", workers=0)  # whatever both left, a later run finishes

    scan = lake.scan("spans")
    assert scan is not None
    df = scan.collect()
    assert df.height == n_spans
    assert df.select(["kafka_partition", "kafka_offset", "span_id"]).unique().height == n_spans
    offsets = pl.col("kafka_offset")
    per = df.group_by("kafka_partition").agg(n=offsets.n_unique(), hi=offsets.max())
    assert per["n"].sum() == n_records
    for p, n, hi in per.iter_rows():
        assert n == hi + 1 and lake.txn("spans", app_id(k.spans_topic, p)) == hi
