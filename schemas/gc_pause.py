"""Cyclic garbage collection paused while OTLP decodes, on any thread: one rule for the collector and ingestion.

Decoding allocates millions of short-lived tuples, strings and records and no reference cycles. The
cyclic collector, set off by allocation counts, walks them over and over: 15% of a pipeline batch's
decoding time, and in the collector full collections of 40-220 ms that stop every thread, the event
loop's too. Here because both sides decode (schemas is the one package both import).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off while any caller is inside, back on when the last one leaves.

    Thread-safe and reentrant: concurrent decodes share one pause. When someone else disabled the
    collector already, it is theirs to turn back on and this leaves it alone.
    """
    global _holders
    with _lock:
        ours = _holders > 0 or gc.isenabled()
        if ours:
            _holders += 1
            gc.disable()
    if not ours:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.enable()
