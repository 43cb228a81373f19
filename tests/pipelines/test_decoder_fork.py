"""Decoder processes are forked from the run's process, which may hold gRPC objects (a collector's, Dagster's).

A reference cycle the parent had not collected yet, freed by a decoder's garbage collector, tears down
gRPC objects whose threads the fork did not copy: the decoder crashed (here) or spun forever (in the suite,
2026-11-27, the run waiting on it for 25 minutes). ``decoder_pool`` freezes the parent's objects while it
forks, so a decoder never frees what it inherited. Real gRPC aio channels and calls, a real fork.
"""

from __future__ import annotations

import asyncio
import gc
import threading

import grpc
import grpc.aio

from pipelines.bronze.decoders import decoder_pool


async def _failed_call_left_in_a_cycle() -> None:
    """An aio channel and a failed call on it, reachable only through a cycle (so only the collector frees them)."""
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    call = channel.unary_unary("/agentlake.Test/Nothing")
    try:
        await call(b"", timeout=0.2)
    except grpc.aio.AioRpcError:
        pass
    holder: dict[str, object] = {"channel": channel, "call": call}
    holder["self"] = holder


def test_a_decoder_never_frees_the_grpc_garbage_it_inherited() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gc.disable()  # the cycles must still be uncollected when the decoders fork
    try:
        for _ in range(5):
            asyncio.run_coroutine_threadsafe(_failed_call_left_in_a_cycle(), loop).result(30)
        pool = decoder_pool(1)
    finally:
        gc.enable()
    decoders = list(pool._processes.values())  # noqa: SLF001 - a hung decoder must not outlive the test
    try:
        # a full collection in the decoder: without the freeze it frees the inherited cycles and spins (or dies)
        assert isinstance(pool.submit(gc.collect).result(timeout=60), int)
        assert pool.submit(sum, [1, 2]).result(timeout=60) == 3, "the decoder still takes work"
    finally:
        for p in decoders:
            p.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        gc.collect()  # the cycles, freed here where gRPC's threads are
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
