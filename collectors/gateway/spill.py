"""The gateway's spill: every recorded call goes to disk first, and on to Kafka from there, in order.

The client already has its answer when the gateway records a call, so nothing may be lost after
that, whether Kafka is away for a minute or a day, or the gateway restarts meanwhile. ``SpillSink``
is a ``RecordSink`` in front of the real one (Kafka): ``send`` appends the records to a log of
segment files under the state folder (``<state>/spill/gateway``) and returns; a background task
reads the log in order and sends it on in batches, one batch at a time, and moves a persisted
cursor past each batch once Kafka acknowledged it. While Kafka is down the task retries with a
backoff; when it is back the backlog drains in the order it was written. A gateway started on a
non-empty spill resends it first.

Bounds: ``max_bytes`` caps what is pending (written, not yet acknowledged). A call that would go
past it is dropped and counted (``dropped``), the only way the spill loses a call. ``stats()``
(records, bytes and dropped, plus the last error) is what the gateway shows at ``/health``.

Delivery is at least once: a crash between Kafka's acknowledgement and the cursor write resends
that batch, and the pipeline keeps one row per (trace id, span id). Writes are flushed to the OS
at once (a killed process loses nothing) but not fsynced per call (a power cut may).

On disk: ``NNNNNNNNNNNNNNNN.seg`` files of frames ``[u32 length][u32 crc32][payload]``, a payload
being one Kafka record (topic, key, value, headers); ``cursor.json`` holds the first segment and
offset not yet acknowledged; ``lock`` is held (flock) by the one gateway that owns the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from collectors.errors import CollectorError, PayloadTooLarge, SinkError
from collectors.records import Record
from collectors.sink import RecordSink

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">II")  # payload length, crc32 of the payload
_SUFFIX = ".seg"
_BATCH_RECORDS = 500
_BATCH_BYTES = 4 << 20
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class SpillFull(SinkError):
    """The spill holds ``max_bytes`` already: the records were dropped (and counted)."""

    status = 507


def encode(record: Record) -> bytes:
    """One record as a spill payload."""
    topic = record.topic.encode()
    key = record.key
    parts = [struct.pack(">H", len(topic)), topic, struct.pack(">i", -1 if key is None else len(key))]
    if key is not None:
        parts.append(key)
    parts += [struct.pack(">I", len(record.value)), record.value, struct.pack(">HI", len(record.headers), record.spans)]
    for name, value in record.headers:
        n = name.encode()
        parts += [struct.pack(">H", len(n)), n, struct.pack(">I", len(value)), value]
    return b"".join(parts)


def decode(payload: bytes) -> Record:
    """The record of a spill payload (inverse of ``encode``)."""
    view = memoryview(payload)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        out = struct.unpack_from(fmt, view, pos)
        pos += struct.calcsize(fmt)
        return out

    def raw(n: int) -> bytes:
        nonlocal pos
        out = bytes(view[pos : pos + n])
        pos += n
        return out

    (tlen,) = take(">H")
    topic = raw(tlen).decode()
    (klen,) = take(">i")
    key = None if klen < 0 else raw(klen)
    (vlen,) = take(">I")
    value = raw(vlen)
    nheaders, spans = take(">HI")
    headers = []
    for _ in range(nheaders):
        (nlen,) = take(">H")
        name = raw(nlen).decode()
        (hlen,) = take(">I")
        headers.append((name, raw(hlen)))
    return Record(topic=topic, key=key, value=value, headers=headers, spans=spans)


@dataclass(frozen=True, order=True)
class Position:
    """A place in the log: segment number, byte offset in it."""

    segment: int
    offset: int


class SpillSink:
    """A ``RecordSink`` that writes to a disk log and forwards it to ``inner`` in the background."""

    def __init__(
        self,
        inner: RecordSink,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int,
        segment_bytes: int = 16 << 20,
    ) -> None:
        self.inner = inner
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = max(64 << 10, min(segment_bytes, max_bytes // 4 or 1))
        self.records = 0  # pending: written, not yet acknowledged by the inner sink
        self.bytes = 0
        self.dropped = 0
        self.sent = 0
        self.last_error: str | None = None
        self._acked = Position(0, 0)  # first byte not yet acknowledged
        self._end = Position(0, 0)  # where the next frame goes
        self._writer: io.FileIO | None = None
        self._lock: IO[bytes] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._opened = False

    # --- lifecycle -------------------------------------------------------------------------------
    def open(self) -> None:
        """Take the folder (one gateway per spill), then recover the pending log from disk."""
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.dir / "lock", "ab")  # noqa: SIM115 - held for the sink's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            raise CollectorError(
                f"another gateway is using the spill folder {self.dir}; give each gateway its own state folder"
            ) from exc
        self._lock = lock
        self._recover()
        self._opened = True

    def start(self) -> None:
        """Open (if not yet) and start forwarding in the background, on the running loop."""
        if not self._opened:
            self.open()
        if self._task is None:
            self._task = asyncio.create_task(self._forward())
            self._wake.set()

    async def close(self, timeout_s: float = 10.0) -> None:
        """Give the forwarder up to ``timeout_s`` to empty the spill while Kafka answers, then stop.

        What is still pending stays on disk for the next start.
        """
        if self._task is not None:
            deadline = time.monotonic() + timeout_s
            while self.records and self.last_error is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        self._opened = False

    def stats(self) -> dict[str, Any]:
        """What is pending, for ``/health`` and ``agentlake status``."""
        return {
            "records": self.records,
            "bytes": self.bytes,
            "dropped": self.dropped,
            "sent": self.sent,
            "max_bytes": self.max_bytes,
            "dir": str(self.dir),
            "last_error": self.last_error,
        }

    # --- writing -----------------------------------------------------------------------------------
    async def send(self, records: Sequence[Record]) -> None:
        """Append ``records`` to the log (all or none); they are on their way to Kafka when this returns."""
        if not records:
            return
        if not self._opened:
            raise SinkError("the gateway's spill is not open")
        frames = []
        for r in records:
            payload = encode(r)
            frames.append(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        size = sum(len(f) for f in frames)
        if self.bytes + size > self.max_bytes:
            self.dropped += len(records)
            raise SpillFull(
                f"the spill {self.dir} is full ({self.bytes} of {self.max_bytes} bytes pending): "
                f"{len(records)} record(s) dropped, {self.dropped} in all"
            )
        writer = self._segment_for_write()
        try:
            data = memoryview(b"".join(frames))
            while data:  # unbuffered: each call is in the OS's hands when send returns
                data = data[writer.write(data) or 0 :]
        except OSError as exc:  # disk full, I/O error: cut the partial frame so the log stays readable
            with contextlib.suppress(OSError):
                writer.truncate(self._end.offset)
            self.dropped += len(records)
            raise SinkError(
                f"could not write to the spill {self.dir}: {exc}; {len(records)} record(s) dropped"
            ) from exc
        self._end = Position(self._end.segment, self._end.offset + size)
        self.records += len(records)
        self.bytes += size
        self._wake.set()

    def _path(self, segment: int) -> Path:
        return self.dir / f"{segment:016d}{_SUFFIX}"

    def _segment_for_write(self) -> io.FileIO:
        if self._writer is not None and self._end.offset >= self.segment_bytes:
            self._writer.close()
            self._writer = None
            self._end = Position(self._end.segment + 1, 0)
        if self._writer is None:
            self._writer = open(self._path(self._end.segment), "ab", buffering=0)  # noqa: SIM115 - kept open
            self._end = Position(self._end.segment, self._writer.tell())
        return self._writer

    # --- recovery ------------------------------------------------------------------------------------
    def _segments(self) -> list[int]:
        out = []
        for p in self.dir.glob(f"*{_SUFFIX}"):
            with contextlib.suppress(ValueError):
                out.append(int(p.name[: -len(_SUFFIX)]))
        return sorted(out)

    def _recover(self) -> None:
        cursor = self._read_cursor()
        segments = self._segments()
        for seg in segments:
            if seg < cursor.segment:
                self._path(seg).unlink(missing_ok=True)  # acknowledged before the last stop
        segments = [s for s in segments if s >= cursor.segment]
        if not segments:
            start = max(cursor.segment, 0)
            self._acked = self._end = Position(start, 0)
            self._write_cursor()
            return
        self._acked = cursor if cursor.segment == segments[0] else Position(segments[0], 0)
        for i, seg in enumerate(segments):
            offset = self._acked.offset if seg == self._acked.segment else 0
            n, good_end, size = self._scan(seg, offset)
            self.records += n
            self.bytes += good_end - offset
            if good_end < size:
                if i == len(segments) - 1:
                    log.warning(
                        "spill %s: cutting a torn write at the end (%d bytes)", self._path(seg), size - good_end
                    )
                    with open(self._path(seg), "r+b") as f:
                        f.truncate(good_end)
                else:
                    log.error("spill %s: corrupt after byte %d; the rest of it is lost", self._path(seg), good_end)
                    self.dropped += 1
                    with open(self._path(seg), "r+b") as f:
                        f.truncate(good_end)
        last = segments[-1]
        self._end = Position(last, self._path(last).stat().st_size)
        if self.records:
            log.info(
                "spill %s: %d record(s) (%d bytes) from before the last stop to resend",
                self.dir,
                self.records,
                self.bytes,
            )

    def _scan(self, segment: int, offset: int) -> tuple[int, int, int]:
        """(frames, end of the last whole frame, file size) of a segment from ``offset``."""
        path = self._path(segment)
        size = path.stat().st_size
        n, pos = 0, offset
        with open(path, "rb") as f:
            f.seek(offset)
            while True:
                head = f.read(_FRAME.size)
                if len(head) < _FRAME.size:
                    break
                length, crc = _FRAME.unpack(head)
                payload = f.read(length)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    break
                n += 1
                pos += _FRAME.size + length
        return n, pos, size

    def _read_cursor(self) -> Position:
        path = self.dir / "cursor.json"
        try:
            data = json.loads(path.read_text())
            return Position(int(data["segment"]), int(data["offset"]))
        except FileNotFoundError:
            return Position(0, 0)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("spill cursor %s is unreadable (%s); resending the whole spill", path, exc)
            return Position(-1, 0)

    def _write_cursor(self) -> None:
        tmp = self.dir / "cursor.json.tmp"
        tmp.write_text(json.dumps({"segment": self._acked.segment, "offset": self._acked.offset}))
        os.replace(tmp, self.dir / "cursor.json")

    # --- forwarding ----------------------------------------------------------------------------------
    def _read_batch(self) -> tuple[list[Record], Position, int]:
        """The next records after the acknowledged cursor: (records, position after them, bytes)."""
        out: list[Record] = []
        pos, size = self._acked, 0
        while len(out) < _BATCH_RECORDS and size < _BATCH_BYTES and pos < self._end:
            path = self._path(pos.segment)
            file_size = path.stat().st_size if path.exists() else 0
            if pos.offset >= file_size:
                if pos.segment >= self._end.segment:
                    break
                pos = Position(pos.segment + 1, 0)  # this segment is done: the next one
                continue
            with open(path, "rb") as f:
                f.seek(pos.offset)
                while len(out) < _BATCH_RECORDS and size < _BATCH_BYTES:
                    head = f.read(_FRAME.size)
                    if len(head) < _FRAME.size:
                        break
                    length, _crc = _FRAME.unpack(head)
                    payload = f.read(length)
                    if len(payload) < length:
                        break
                    out.append(decode(payload))
                    size += _FRAME.size + length
                    pos = Position(pos.segment, pos.offset + _FRAME.size + length)
        return out, pos, size

    def _ack(self, upto: Position, n: int, size: int) -> None:
        old = self._acked
        self._acked = upto
        self.records -= n
        self.bytes -= size
        self.sent += n
        if self.records == 0:
            # Everything is acknowledged: the next write starts a fresh segment, the old ones go.
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._end = self._acked = Position(self._end.segment + 1, 0)
        self._write_cursor()
        for seg in range(old.segment, self._acked.segment):
            self._path(seg).unlink(missing_ok=True)

    async def _forward(self) -> None:
        failures = 0
        while True:
            if not self.records:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, upto, size = self._read_batch()
            if not batch:
                await asyncio.sleep(0.05)
                continue
            try:
                await self.inner.send(batch)
            except asyncio.CancelledError:
                raise
            except PayloadTooLarge:
                await self._send_one_by_one(batch)
            except Exception as exc:  # noqa: BLE001 - whatever the sink says, keep the records and retry
                self.last_error = str(exc) or type(exc).__name__
                delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
                if failures % 10 == 0:
                    log.warning("spill: %d record(s) wait for Kafka (%s); retrying", self.records, self.last_error)
                failures += 1
                await asyncio.sleep(delay)
                continue
            failures = 0
            self.last_error = None
            self._ack(upto, len(batch), size)

    async def _send_one_by_one(self, batch: Sequence[Record]) -> None:
        """A batch holding a record Kafka will never take: send each alone; drop (and count) the refused.

        Records of the batch that Kafka took before the refusal may be sent twice (at least once).
        """
        for record in batch:
            while True:
                try:
                    await self.inner.send([record])
                    break
                except PayloadTooLarge as exc:
                    log.error("spill: a record Kafka refuses as too large was dropped: %s", exc)
                    self.dropped += 1
                    self.sent -= 1  # counted as sent by the caller's acknowledgement
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - as in _forward: keep it and retry
                    self.last_error = str(exc) or type(exc).__name__
                    await asyncio.sleep(1.0)
