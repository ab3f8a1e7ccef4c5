"""Stress, on every backend, under asyncio and trio (not timed: each test asserts results and
that memory and threads come back to where they were).

- 1,000 concurrent tasks over four streams, each checking its own result;
- a cancellation storm: 200 tasks cancelled at random points of their waits;
- 10,000 allocate / operate / free cycles;
- 20 open / shutdown cycles of a second backend instance.
"""

from __future__ import annotations

import gc
import random
import threading

import anyio
import anyio.to_thread
import numpy as np
import pytest

import accelkit
from accelkit import ComputeBackend, DType

pytestmark = pytest.mark.anyio


def _settled_used(backend: ComputeBackend) -> int:
    """``used`` once every tensor no longer referenced has gone back to the pool."""
    gc.collect()
    return backend.memory_manager.memory_info().used


async def test_a_thousand_concurrent_tasks_over_four_streams(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    await backend.synchronize()
    baseline = _settled_used(backend)
    streams = [backend.create_stream() for _ in range(4)]
    results: dict[int, np.ndarray] = {}

    async def task(i: int) -> None:
        with backend.use_stream(streams[i % 4]):
            x = f.full((16,), float(i))
            y = ops.add(ops.mul(x, 2.0), 1.0)
        await anyio.lowlevel.checkpoint()  # interleave the tasks' submissions and waits
        results[i] = await y.to_host()

    async with anyio.create_task_group() as tg:
        for i in range(1000):
            tg.start_soon(task, i)
    await backend.synchronize()
    assert len(results) == 1000
    for i, got in results.items():
        np.testing.assert_array_equal(got, np.full(16, 2.0 * i + 1.0, np.float32))
    results.clear()
    assert _settled_used(backend) == baseline


async def test_a_cancellation_storm_leaves_the_backend_consistent(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    await backend.synchronize()
    baseline = _settled_used(backend)
    rng = random.Random(7)
    x = f.from_host(np.full((256, 256), 1.0 / 256, np.float32))
    finished = 0

    np.testing.assert_allclose(await ops.matmul(x, x).to_host(), 1.0 / 256, rtol=1e-5)  # warm

    async def task(delay: float | None) -> None:
        nonlocal finished
        with anyio.move_on_after(float("inf") if delay is None else delay):
            y = ops.matmul(x, x)  # x @ x: every element 1/256
            got = await y.to_host()
            np.testing.assert_allclose(got, 1.0 / 256, rtol=1e-5)
            finished += 1

    async with anyio.create_task_group() as tg:
        for _ in range(200):
            tg.start_soon(task, rng.choice([0.0, 0.0001, 0.001, 0.01, None]))
    await backend.synchronize()  # what was submitted before a cancel still completes
    assert finished > 0, "no task ran to completion (a fifth of them are never cancelled)"
    # The backend still works, and nothing is held by the cancelled waits.
    np.testing.assert_allclose(await ops.matmul(x, x).to_host(), 1.0 / 256, rtol=1e-5)
    backend.memory_manager.free(x)
    assert _settled_used(backend) == baseline


async def test_ten_thousand_allocate_operate_free_cycles(backend: ComputeBackend) -> None:
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    await backend.synchronize()
    baseline = _settled_used(backend)
    sizes = [1, 7, 64, 1000, 4096]
    total = f.zeros((1,), DType.F32)
    for i in range(10_000):
        n = sizes[i % len(sizes)]
        t = f.full((n,), 1.0)
        total = ops.add(total, ops.sum(ops.mul(t, 1.0), keepdims=False))
        mm.free(t)
        if i % 2500 == 2499:
            await anyio.lowlevel.checkpoint()
    expected = sum(sizes[i % len(sizes)] for i in range(10_000))
    np.testing.assert_allclose(await total.to_host(), [expected], rtol=1e-6)
    del total, t
    info = mm.memory_info()
    assert _settled_used(backend) == baseline
    # The pool reuses its blocks: what it holds follows the peak of live memory (which depends
    # on how far a backend's queue runs ahead), not the number of cycles.
    assert info.reserved <= 4 * info.peak + 2**20, f"the pool holds {info.reserved} bytes"


def _worker_threads() -> set[threading.Thread]:
    """The threads backends start per stream or per session (named ``accelkit-...``); the
    process-wide background verification of device kernels is not one of them."""
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("accelkit-") and "verify" not in t.name
    }


async def test_twenty_open_and_shutdown_cycles_leak_no_threads_or_memory(
    backend: ComputeBackend,
) -> None:
    before = _worker_threads()
    for i in range(20):
        async with accelkit.open_backend(backend.name) as other:
            f, ops = other.tensor_factory, other.tensor_ops
            got = await ops.add(f.full((8,), float(i)), 1.0).to_host()
            np.testing.assert_array_equal(got, np.full(8, i + 1.0, np.float32))
            mm = other.memory_manager
        assert mm.memory_info().used == 0
    gc.collect()
    # A session's worker threads end with it (a moment after shutdown returns, at most).
    for thread in _worker_threads() - before:
        await anyio.to_thread.run_sync(thread.join, 10.0)
        assert not thread.is_alive(), f"{thread.name} outlived its backend's shutdown"
