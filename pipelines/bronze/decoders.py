"""Kafka records to bronze rows, in forked decoder processes or in this one.

Decoding is Python, so more cores only help from other processes. Span text is redacted before it
is stored (`pipelines.bronze.redact`, the ``[redaction]`` settings the caller passes, else this
process's): each decoded batch, in the decoder process that decoded it.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pyarrow as pa

from pipelines.bronze.decoding import (
    KafkaRecord,
    decode_reward_event,
    decode_spans,
    quarantine_row,
)
from pipelines.bronze.positions import Kind
from pipelines.bronze.redact import Redactor, redact_spans
from schemas.config import RedactionSettings
from schemas.tables import REWARDS


def default_workers(kind: Kind) -> int:
    """Decoder processes worth forking for ``kind``: two on a 2-core machine, one per core left over above that.

    Decoding is Python, so more cores only help from other processes. Handing records over costs
    CPU too (pickling, copy-on-write faults), but much less than it frees: measured on 2 cores
    (``benchmarks/bench_pipelines.py --workers 0`` vs the default), two decoders ingest about 20%
    more spans/s than decoding in process, three no more than two. Reward events are small JSON
    records: always decoded in process.
    """
    cpus = os.cpu_count() or 1
    if kind != "spans" or cpus < 2:
        return 0
    return min(4, max(2, cpus - 1))


_REDACTORS: dict[str, Redactor] = {}
_WORKER_REDACTOR: Redactor | None = None  # a decoder process's: its pool's run's


def redactor_for(redaction: RedactionSettings | None) -> Redactor:
    """The redactor of ``redaction`` (None: this process's settings), one per distinct settings."""
    if redaction is None:
        from schemas.config import load_settings

        redaction = load_settings().redaction
    key = redaction.model_dump_json()
    if key not in _REDACTORS:
        if len(_REDACTORS) > 16:  # settings that change run after run: stay bounded
            _REDACTORS.clear()
        _REDACTORS[key] = Redactor(redaction)
    return _REDACTORS[key]


def _decoder_init(redactor: Redactor | None = None) -> None:
    """A decoder dies with its parent, even one killed with SIGKILL (Linux), instead of lingering;
    it redacts with the run's ``redactor`` (handed over by the fork, never pickled per batch)."""
    global _WORKER_REDACTOR
    _WORKER_REDACTOR = redactor
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def decoder_pool(workers: int, redactor: Redactor | None = None) -> ProcessPoolExecutor:
    """Decoder processes, forked now (fork: nothing to re-import, so a run pays milliseconds).

    Every object this process holds is frozen while the workers fork: a decoder's garbage collector then
    never frees what it inherited. A cycle the parent had not collected yet could hold gRPC objects (a
    collector's or Dagster's), whose teardown needs gRPC's threads, which a fork does not copy: freed in
    a decoder it crashed the decoder or spun forever while the run waited on it (seen in the suite).
    """
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("fork"), initializer=_decoder_init, initargs=(redactor,)
    )
    gc.freeze()
    try:
        started = pool.submit(int)  # with fork, the first submit starts every worker
    finally:
        gc.unfreeze()
    started.result()
    return pool


def decode_in_worker(kind: Kind, batch: list[KafkaRecord]) -> tuple[pa.Table, list[dict[str, Any]]]:
    """``decode_batch`` in a decoder process, with the redactor its pool was forked with."""
    if kind == "spans" and _WORKER_REDACTOR is None:
        raise RuntimeError("a decoder process without a redactor: spans would be stored unredacted")
    return decode_batch(kind, batch, _WORKER_REDACTOR)


def decode_batch(
    kind: Kind, batch: list[KafkaRecord], redactor: Redactor | None = None
) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Rows and quarantine rows of ``batch``; spans redacted by ``redactor`` (None: not redacted,
    their ``redacted`` column null; only for comparing ids, never for rows that are stored)."""
    if kind == "spans":
        table, quarantined = decode_spans(batch)
        return (table if redactor is None else redact_spans(table, redactor)), quarantined
    rows: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for rec in batch:
        try:
            rows.append(decode_reward_event(rec))
        except Exception as exc:  # noqa: BLE001 - quarantined with the message, never fatal
            bad.append(quarantine_row(rec, f"{type(exc).__name__}: {exc}"))
    return pa.Table.from_pylist(rows, schema=REWARDS), bad
