"""Streams and events under asyncio and trio: ordering, cross-stream waits, automatic dependencies,
cancellation, a free event loop while device work runs, ``use_stream``, and kernel errors."""

from __future__ import annotations

import sys
import threading
from typing import Any, cast

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import accelkit
from accelkit import (
    ComputeBackend,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    Tensor,
    TensorFactory,
    TensorOps,
)

pytestmark = pytest.mark.anyio

N = 1024  # matrices big enough that each product runs on a stream's worker, not inline


def _idempotent(f: TensorFactory, n: int = N) -> Tensor:
    """J/n (all entries 1/n): (J/n) @ (J/n) == J/n exactly in float32 for n a power of two."""
    return f.full((n, n), 1.0 / n)


def _chain(ops: TensorOps, x: Tensor, length: int) -> Tensor:
    y = x
    for _ in range(length):
        y = ops.matmul(y, x)
    return y


async def test_one_stream_runs_in_submission_order(backend: ComputeBackend) -> None:
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    s = backend.create_stream()
    with backend.use_stream(s):
        a = f.full((512, 512), 1.0)
        y = ops.matmul(a, a)  # reads a (queued on the worker)
        mm.copy_dtod(a, f.zeros((512, 512)))  # then overwrites it: must wait for the read
        z = ops.add(a, 1.0)  # and this reads the overwritten a
        w = ops.mul(y, 2.0)
    np.testing.assert_array_equal(await y.to_host(), np.full((512, 512), 512.0, np.float32))
    np.testing.assert_array_equal(await z.to_host(), np.ones((512, 512), np.float32))
    np.testing.assert_array_equal(await w.to_host(), np.full((512, 512), 1024.0, np.float32))


async def test_in_place_updates_apply_in_order(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    shape = (200, 200)  # past the inline threshold
    param, m, v = f.ones(shape), f.zeros(shape), f.zeros(shape)
    grads = [f.full(shape, g) for g in (1.0, -2.0, 0.5, 3.0)]
    p_ref, m_ref, v_ref = 1.0, 0.0, 0.0
    for step, (g_t, g) in enumerate(zip(grads, (1.0, -2.0, 0.5, 3.0), strict=True), start=1):
        ops.adam_update(param, g_t, m, v, lr=0.1, step=step, weight_decay=0.01)
        m_ref = 0.9 * m_ref + 0.1 * g
        v_ref = 0.999 * v_ref + 0.001 * g * g
        upd = (m_ref / (1 - 0.9**step)) / (np.sqrt(v_ref / (1 - 0.999**step)) + 1e-8)
        p_ref = p_ref - 0.1 * (upd + 0.01 * p_ref)
    np.testing.assert_allclose(await param.to_host(), np.full(shape, p_ref), rtol=1e-5)
    np.testing.assert_allclose(await m.to_host(), np.full(shape, m_ref), rtol=1e-5)


async def test_wait_event_orders_work_across_streams(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    s1, s2 = backend.create_stream(), backend.create_stream()
    x = _idempotent(f)
    small = f.ones((4,))
    with backend.use_stream(s1):
        y = _chain(ops, x, 6)  # tens of milliseconds of work
    ev = s1.record_event()
    s2.wait_event(ev)
    with backend.use_stream(s2):
        z = ops.add(small, 1.0)  # shares no tensor with s1's work: only the event orders it
    np.testing.assert_array_equal(await z.to_host(), [2.0] * 4)
    assert ev.query(), "work after wait_event completed before the event"
    np.testing.assert_array_equal(await y.to_host(), np.full((N, N), 1.0 / N, np.float32))


async def test_reading_a_tensor_written_on_another_stream_waits_for_the_writer(
    backend: ComputeBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = _idempotent(f)
    # Fill the cache with blocks of NaN, so an early read of a result shows NaN, not zeros.
    poison = [f.full((N, N), float("nan")) for _ in range(4)]
    await backend.synchronize()
    del poison
    s1, s2 = backend.create_stream(), backend.create_stream()
    with backend.use_stream(s1):
        y = _chain(ops, x, 4)
    with backend.use_stream(s2):
        z = ops.add(y, 1.0)  # large: queued on s2, after s1's write of y
        small = ops.sum(ops.narrow(y, 0, 0, 1))  # small ops depend on y too
    np.testing.assert_array_equal(await z.to_host(), np.full((N, N), 1.0 + 1.0 / N, np.float32))
    np.testing.assert_allclose(await small.to_host(), 1.0, rtol=1e-6)
    # The default stream reads it correctly too, and a transfer waits for exactly the writer.
    np.testing.assert_array_equal(await y.to_host(), np.full((N, N), 1.0 / N, np.float32))


async def test_events_query_and_wait(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    s = backend.create_stream()
    idle = s.record_event()
    assert idle.stream is s
    assert idle.query()
    assert s.query()
    await idle.wait()
    x = _idempotent(f)
    with backend.use_stream(s):
        y = _chain(ops, x, 3)
    ev1 = s.record_event()
    with backend.use_stream(s):
        z = _chain(ops, x, 2)
    ev2 = s.record_event()
    await ev2.wait()
    assert ev1.query()
    assert ev2.query()
    assert s.query()
    await ev1.wait()  # already complete: returns at once
    await anyio.to_thread.run_sync(ev2.wait_blocking)
    np.testing.assert_array_equal(await y.to_host(), await z.to_host())
    await s.synchronize()


async def test_backend_synchronize_waits_for_every_stream(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = _idempotent(f)
    streams = [backend.create_stream() for _ in range(2)]
    results = []
    for s in streams:
        with backend.use_stream(s):
            results.append(_chain(ops, x, 2))
    results.append(_chain(ops, x, 2))  # and the default stream
    await backend.synchronize()
    assert all(s.query() for s in streams)
    assert backend.default_stream.query()
    assert backend.status.pending_operations == 0


async def test_cancelling_a_transfer_leaves_the_backend_usable_and_accounted(
    backend: ComputeBackend,
) -> None:
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    n = 2048
    baseline = mm.memory_info().used
    x = _idempotent(f, n)
    y = _chain(ops, x, 4)  # a few hundred milliseconds of work
    with anyio.move_on_after(0.001) as scope:
        await y.to_host()
    assert scope.cancelled_caught
    # The work went on; the result is intact and correct.
    got = await y.to_host()
    np.testing.assert_array_equal(got, np.full((n, n), 1.0 / n, np.float32))
    np.testing.assert_array_equal(await ops.add(f.ones((3,)), 1.0).to_host(), [2.0] * 3)
    # Cancel again, this time dropping every reference while the work is still queued.
    y2 = _chain(ops, x, 3)
    with anyio.move_on_after(0.001) as scope:
        await backend.synchronize()
    assert scope.cancelled_caught
    del y, y2, x, got
    await backend.synchronize()
    assert mm.memory_info().used == baseline
    assert backend.status.pending_operations == 0


async def test_cancelling_event_and_stream_waits(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    s = backend.create_stream()
    x = _idempotent(f)
    with backend.use_stream(s):
        y = _chain(ops, x, 6)
    ev = s.record_event()
    with anyio.move_on_after(0.001) as scope:
        await ev.wait()
    assert scope.cancelled_caught
    with anyio.move_on_after(0.001) as scope:
        await s.synchronize()
    assert scope.cancelled_caught
    await ev.wait()  # a later wait works
    assert ev.query()
    np.testing.assert_array_equal(await y.to_host(), np.full((N, N), 1.0 / N, np.float32))


async def test_the_event_loop_is_not_blocked_while_a_large_matmul_runs(
    backend: ComputeBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = _idempotent(f, 2048)
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.005)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        await anyio.lowlevel.checkpoint()
        y = _chain(ops, x, 4)  # submissions: return at once
        before = ticks
        result = await y.to_host()
        during = ticks - before
        tg.cancel_scope.cancel()
    np.testing.assert_array_equal(result, np.full((2048, 2048), 1.0 / 2048, np.float32))
    # Hundreds of milliseconds of matmul; a blocked loop would tick at most once. Generous bound.
    assert during >= 3, f"the heartbeat ticked only {during} times while the matmuls ran"


async def test_a_large_to_host_copies_off_the_event_loop(
    backend: ComputeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regression (issue 15): ``await t.to_host()`` of a 4096x4096 f32 result copied 64 MiB on
    the loop's thread, blocking it for up to 156 ms. Large copies now run on a worker thread
    (small ones stay inline: a thread hand-off would cost more than they do)."""
    from accelkit._core import host_memory

    copies: list[tuple[int, int]] = []
    real = host_memory._copy

    def spy(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        copies.append((array.nbytes, threading.get_native_id()))
        return real(array)

    monkeypatch.setattr(host_memory, "_copy", spy)
    loop_thread = threading.get_native_id()
    f = backend.tensor_factory
    small = f.full((64,), 2.0)
    big = f.full((4096, 4096), 3.0)
    np.testing.assert_array_equal(await small.to_host(), np.full(64, 2.0, np.float32))
    got = await big.to_host()
    assert got.shape == (4096, 4096)
    assert (got == 3.0).all()
    assert copies[0] == (256, loop_thread)
    assert copies[1][0] == 4096 * 4096 * 4
    assert copies[1][1] != loop_thread, "the 64 MiB copy ran on the event loop's thread"


async def test_from_host_async_snapshots_large_arrays_off_the_event_loop(
    backend: ComputeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = backend.tensor_factory.kernels
    real = kernels.from_host
    threads: list[int] = []

    def spy(out: accelkit.Tensor, array: np.ndarray[Any, Any]) -> None:
        threads.append(threading.get_native_id())
        real(out, array)

    monkeypatch.setattr(kernels, "from_host", spy)
    loop_thread = threading.get_native_id()
    small = await backend.tensor_factory.from_host_async(np.ones(16, np.float32))
    big = await backend.tensor_factory.from_host_async(np.full((1024, 1024), 2.0, np.float32))
    assert threads[0] == loop_thread
    assert threads[1] != loop_thread, "the 4 MiB snapshot ran on the event loop's thread"
    assert (await small.to_host() == 1.0).all()
    assert (await big.to_host() == 2.0).all()


async def test_use_stream_sends_work_to_that_stream(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    blocker, target = backend.create_stream(), backend.create_stream()
    x = _idempotent(f)
    with backend.use_stream(blocker):
        _chain(ops, x, 6)
    ev = blocker.record_event()
    target.wait_event(ev)  # work on `target` now waits for the blocker
    small = f.ones((3,))
    with backend.use_stream(target):
        assert backend.current_stream is target
        z = ops.mul(small, 5.0)
    assert backend.current_stream is backend.default_stream
    np.testing.assert_array_equal(await z.to_host(), [5.0] * 3)
    assert ev.query(), "the op inside use_stream did not run on that stream"


async def test_use_stream_is_per_task(backend: ComputeBackend) -> None:
    s = backend.create_stream()
    seen = {}
    entered = anyio.Event()
    release = anyio.Event()

    async def outside() -> None:
        await entered.wait()
        seen["outside"] = backend.current_stream
        release.set()

    async def inside() -> None:
        seen["inside"] = backend.current_stream

    async with anyio.create_task_group() as tg:
        tg.start_soon(outside)
        with backend.use_stream(s):
            tg.start_soon(inside)  # a task started here inherits the setting
            entered.set()
            await release.wait()
    assert seen["inside"] is s
    assert seen["outside"] is backend.default_stream


async def test_kernel_errors_surface_at_the_await(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    weight = f.ones((10, 4))
    bad_idx = f.from_host(np.full((200, 200), 12, np.int64))  # large: runs on the worker
    bad = ops.embedding(bad_idx, weight)  # returns at once
    good = ops.embedding(f.from_host(np.zeros((200, 200), np.int64)), weight)
    with pytest.raises(InvalidArgumentError, match="12"):
        await bad.to_host()
    np.testing.assert_array_equal(await good.to_host(), np.ones((200, 200, 4), np.float32))


async def test_kernel_errors_surface_at_event_and_stream_waits(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    s = backend.create_stream()
    with backend.use_stream(s):
        bad = ops.embedding(f.from_host([5]), f.ones((2, 2)))
    ev = s.record_event()
    with pytest.raises(InvalidArgumentError, match="5"):
        await ev.wait()
    await s.synchronize()  # reported once
    with backend.use_stream(s):
        bad2 = ops.gather(f.ones((2, 2)), 1, f.from_host([[0, 7]]))
    with pytest.raises(InvalidArgumentError, match="7"):
        await s.synchronize()
    del bad, bad2


async def test_unexpected_kernel_failures_become_device_errors(
    backend: ComputeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelkit._core.host_kernels import nn as numpy_nn

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the device caught fire")

    monkeypatch.setattr(numpy_nn, "softmax", broken)
    y = backend.tensor_ops.softmax(backend.tensor_factory.ones((3, 3)))
    with pytest.raises(DeviceError, match="caught fire") as info:
        await y.to_host()
    assert isinstance(info.value.__cause__, RuntimeError)
    monkeypatch.undo()
    np.testing.assert_allclose(
        await backend.tensor_ops.softmax(backend.tensor_factory.ones((2,))).to_host(), [0.5, 0.5]
    )


async def test_concurrent_tasks_share_a_backend(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    results = {}

    async def worker(i: int) -> None:
        x = f.full((300, 300), float(i))
        y = ops.matmul(x, f.eye(300))
        await anyio.lowlevel.checkpoint()
        results[i] = await y.to_host()

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(worker, i)
    for i in range(8):
        np.testing.assert_array_equal(results[i], np.full((300, 300), float(i), np.float32))


async def test_blocking_twins_from_a_worker_thread(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    y = _chain(ops, _idempotent(f), 3)
    got = await anyio.to_thread.run_sync(y.numpy)
    np.testing.assert_array_equal(got, np.full((N, N), 1.0 / N, np.float32))
    s = backend.create_stream()
    with backend.use_stream(s):
        _chain(ops, _idempotent(f), 2)
    ev = s.record_event()
    await anyio.to_thread.run_sync(ev.wait_blocking)
    assert ev.query()


async def test_shutdown_waits_for_queued_work_and_releases_memory() -> None:
    async with accelkit.open_backend("cpu") as b:
        f, ops = b.tensor_factory, b.tensor_ops
        y = _chain(ops, _idempotent(f), 4)
        s = b.create_stream()
        with b.use_stream(s):
            bad = ops.embedding(f.from_host([9]), f.ones((2, 2)))  # an unobserved failure
        mm = b.memory_manager
    # Shutdown neither raised the unobserved error nor left anything allocated or running.
    assert mm.memory_info().used == 0
    assert not y.is_alive
    assert not bad.is_alive
    assert b.status.pending_operations == 0


async def test_queued_work_keeps_the_tensors_it_uses_out_of_the_pool(
    backend: ComputeBackend,
) -> None:
    """Tensors dropped while an op on them waits in a stream's queue keep their blocks until it
    has run: another stream must not be handed the block of an input (and overwrite it before
    the op reads it) or of an output (and see the op write into its data). The ufunc fast path
    once held only the arrays, and ``a + b`` came out as ``100 + b``."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    s1, s2 = backend.create_stream(), backend.create_stream()
    n = 1 << 16
    a, b = f.full((n,), 1.0), f.full((n,), 2.0)
    p, q = f.full((n,), 3.0), f.full((n,), 4.0)
    await backend.synchronize()
    gate = threading.Event()
    s1.submit(gate.wait, True)  # type: ignore[attr-defined]  # HostStream: s1 waits for the gate
    try:
        with backend.use_stream(s1):
            c = ops.add(a, b)  # the fast path (one ufunc)
            e = ops.add(p, 5)  # the general path
            dropped_out = ops.mul(p, q)
            del a, p, dropped_out
        with backend.use_stream(s2):
            others = [f.full((n,), 100.0) for _ in range(3)]
            await s2.synchronize()
    finally:
        gate.set()
    np.testing.assert_array_equal(await c.to_host(), np.full(n, 3.0, np.float32))
    np.testing.assert_array_equal(await e.to_host(), np.full(n, 8.0, np.float32))
    for x in others:
        np.testing.assert_array_equal(await x.to_host(), np.full(n, 100.0, np.float32))


def test_a_waiter_unregistered_never_shows_a_wrong_first_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ``Waiters.first`` is read without the lock (a stream's hint: is this position awaited?).
    # Unregistering a waiter rebuilds the heap; a reader between the removal and the heapify
    # must not see a later position first (the CUDA backend's inline launch would then skip
    # recording the end of a position someone waits for, and that waiter would hang).
    import heapq

    from accelkit._core import positions

    lock = threading.Lock()
    waiters = positions.Waiters(lock)
    never = lambda: 0  # noqa: E731 - nothing completes
    remove_first = waiters.add(5, lambda: None, never)
    waiters.add(10, lambda: None, never)
    waiters.add(5, lambda: None, never)
    seen: list[int | None] = []
    heapify = heapq.heapify

    def observed(heap: list[Any]) -> None:
        seen.append(waiters.first())  # what another thread could read at this moment
        heapify(heap)

    monkeypatch.setattr(heapq, "heapify", observed)  # (the module positions uses)
    assert remove_first is not None
    remove_first()
    assert seen
    assert all(first == 5 for first in seen), seen
    assert waiters.first() == 5
    assert len(waiters) == 2


async def test_no_stream_is_created_while_shutdown_runs(anyio_backend: str) -> None:
    """A stream opened while shutdown drains would never be closed (its thread left running,
    its work accepted after shutdown): create_stream refuses then."""
    b = accelkit.create_backend("cpu")
    await b.initialize()
    x = b.tensor_factory.ones((1024, 1024))
    for _ in range(8):
        x = b.tensor_ops.matmul(x, x)
    refused: list[BaseException] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(b.shutdown)
        with anyio.fail_after(10):
            while not cast(Any, b)._closing:  # noqa: ASYNC110 - until shutdown has begun
                await anyio.sleep(0.001)
        try:
            b.create_stream()
        except NotInitializedError as exc:
            refused.append(exc)
    assert "shutting down" in str(refused[0])
    assert b.status.state is accelkit.LifecycleState.SHUT_DOWN


async def test_a_large_to_host_waits_for_its_writer_not_for_later_work(
    backend: ComputeBackend,
) -> None:
    """A 4 MiB tensor already written, read while the stream runs a long chain queued after
    it: the copy waits for its writer only (queued on the stream behind the chain, it took the
    chain's second instead of milliseconds), and a free meanwhile still keeps its block."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.full((1 << 20,), 2.0)
    await x.to_host()
    y = _chain(ops, _idempotent(f), 12)  # queued after x: seconds of matmuls here
    got = await x.to_host()
    assert not backend.default_stream.query(), "to_host waited for the later chain"
    np.testing.assert_array_equal(got, np.full(1 << 20, 2.0, np.float32))
    np.testing.assert_array_equal(await y.to_host(), np.full((N, N), 1.0 / N, np.float32))


def test_an_interrupt_during_an_inline_op_is_raised_at_once_and_fails_its_position() -> None:
    """Ctrl-C lands on the thread that runs an op inline: the KeyboardInterrupt was kept as the
    op's failure (the loop was not interrupted) and came back as a DeviceError at the next
    await. It is raised by the submission now, and the position fails, saying so."""
    from accelkit.sdk import HostStream

    stream = HostStream(accelkit.Device("cpu", 0), "interrupted")

    def interrupted() -> None:
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            stream.submit(interrupted, False, (), ())
        assert stream.completed == stream.submitted == 1  # done, not left pending
        seq = stream.submit(lambda: None, False, (), ())  # the stream runs on
        with pytest.raises(
            DeviceError, match=r"an operation was interrupted \(KeyboardInterrupt\)"
        ):
            stream.wait_for_blocking(seq)
    finally:
        stream.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the child picks its own loops
@pytest.mark.parametrize("name", ["cpu", "example"])
async def test_a_program_that_ends_without_shutdown_exits(name: str) -> None:
    """A program that returns (or dies of an exception) with products still queued on a host
    stream and never shuts its backend down exits at once, with its own status: the worker
    thread in BLAS while the interpreter finalized hung the exit for good."""
    code = (
        "import anyio, sys, numpy as np, accelkit as ak\n"
        "async def main():\n"
        "    b = ak.create_backend(sys.argv[1]); await b.initialize()\n"
        "    x = b.tensor_factory.from_host(np.ones((2048, 2048), np.float32))\n"
        "    s1, s2 = b.create_stream(), b.create_stream()\n"
        "    with b.use_stream(s1):\n"
        "        for _ in range(3): x = b.tensor_ops.matmul(x, x)\n"
        "    with b.use_stream(s2): y = b.tensor_ops.matmul(x, x)  # waits for s1's work\n"
        "    await anyio.sleep(0.3)  # s2's worker waits in it\n"
        "    if sys.argv[2] == 'raise': raise RuntimeError('the app failed')\n"
        "anyio.run(main, backend=sys.argv[3])\n"
    )
    # (also with work on a second stream that waits for the first's: the exit dropped the
    # first's queue and waited 60 s for the second, whose worker waited for it)
    for end, loop in (("return", "trio"), ("return", "asyncio"), ("raise", "trio")):
        with anyio.fail_after(40):
            proc = await anyio.run_process(
                [sys.executable, "-c", code, name, end, loop], check=False
            )
        assert proc.returncode == (1 if end == "raise" else 0), (end, loop, proc.stderr[-2000:])
