"""The facade: identity, capabilities, status and lifecycle."""

from __future__ import annotations

import threading
from typing import cast

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from pydantic import ValidationError

import accelkit
from accelkit import ComputeBackend, Device, DType, LifecycleState, Requirements
from accelkit.errors import AccelError, InvalidArgumentError, StaleHandleError
from accelkit.ops.tensor_ops import TENSOR_OPS, UNARY_OPS

from .checks import fetch

pytestmark = pytest.mark.anyio


async def test_identity_and_capabilities(backend: ComputeBackend) -> None:
    caps = backend.capabilities
    assert isinstance(backend.name, str)
    assert backend.name
    assert isinstance(backend.version, str)
    assert backend.version
    assert caps.backend == backend.name
    assert caps.device == str(backend.device)
    assert DType.F32 in caps.dtypes
    assert backend.supports_device(cast(Device, backend.device))  # initialized: not None
    # Every TensorOps name the backend claims is there to call.
    claimed = caps.ops & TENSOR_OPS
    assert {"add", "matmul", "reduce"} <= claimed
    x = backend.tensor_factory.ones((2,))
    flags = backend.tensor_factory.ones((2,), DType.BOOL)
    for name in claimed:
        if name in UNARY_OPS:  # reachable through unary(); most also have a named shortcut
            arg = flags if UNARY_OPS[name] == "int" else x
            assert backend.tensor_ops.unary(name, arg).shape == (2,)
        else:
            assert callable(getattr(backend.tensor_ops, name, None)), (
                f"{name} is claimed but missing"
            )
    # Every claimed dtype can hold a tensor.
    for dt in caps.dtypes:
        assert backend.tensor_factory.zeros((2,), dt).dtype is dt
    assert caps.meets(Requirements(ops={"matmul"}, dtypes={DType.F32}))
    with pytest.raises(ValidationError):
        caps.backend = "other"  # type: ignore[misc]  # frozen: the error under test


async def test_status_snapshot(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    keep = f.ones((1000,))
    await backend.synchronize()
    status = backend.status
    assert status.backend == backend.name
    assert status.state is LifecycleState.READY
    assert status.device == str(backend.device)
    assert status.memory_used_bytes == backend.memory_manager.memory_info().used >= keep.nbytes
    assert status.pending_operations == 0
    assert status.completed_operations >= 1
    assert status.error is None


async def test_synchronize_and_initialize_again(backend: ComputeBackend) -> None:
    t = backend.tensor_ops.mul(backend.tensor_factory.ones((64, 64)), 3.0)
    await backend.synchronize()
    await backend.synchronize(backend.device)
    await backend.synchronize(str(backend.device))
    await backend.initialize(backend.device)  # same device: nothing happens
    assert backend.is_ready
    np.testing.assert_array_equal(await fetch(t), np.full((64, 64), 3.0, np.float32))


async def test_open_backend_by_device_and_async_with(backend: ComputeBackend) -> None:
    async with accelkit.open_backend(backend.device) as by_device:
        assert by_device.device == backend.device
        assert by_device is not backend
    assert not by_device.is_ready
    async with accelkit.create_backend(backend.name) as entered:
        assert entered.is_ready
        np.testing.assert_array_equal(await fetch(entered.tensor_factory.ones((2,))), [1.0, 1.0])
    assert entered.status.state is LifecycleState.SHUT_DOWN


async def test_shutdown_releases_every_byte_and_invalidates_tensors(
    backend: ComputeBackend,
) -> None:
    async with accelkit.open_backend(backend.name) as other:
        f, ops = other.tensor_factory, other.tensor_ops
        keep = [f.ones((256, 256)), ops.matmul(f.ones((128, 128)), f.ones((128, 128)))]
        buf = other.memory_manager.allocate(12345)
        assert other.memory_manager.memory_info().used > 0
    info = other.memory_manager.memory_info()
    assert (info.used, info.reserved, info.active_allocations) == (0, 0, 0)
    assert all(not t.is_alive for t in keep)
    assert not buf.is_alive


async def test_a_stream_kept_past_shutdown_is_stale(backend: ComputeBackend) -> None:
    """record_event and wait_event on a stream of a shut-down backend raise StaleHandleError,
    as every handle kept past shutdown does (the CPU's returned an event marking nothing,
    reported done; then CPU and OpenCL raised DeviceError, CUDA and isolated backends
    NotInitializedError); so does ``use_stream`` of it once the backend is open again (it
    said the stream was another backend's)."""
    other = accelkit.create_backend(backend.name)
    await other.initialize(backend.device)
    kept, second = other.default_stream, other.create_stream()
    event = second.record_event()
    await other.shutdown()
    with pytest.raises(StaleHandleError, match="closed"):
        kept.record_event()
    with pytest.raises(StaleHandleError, match="closed"):
        kept.wait_event(event)
    await other.initialize(backend.device)
    try:
        with (
            pytest.raises(StaleHandleError, match="before it was shut down"),
            other.use_stream(second),
        ):
            pass
    finally:
        await other.shutdown()


async def test_default_and_current_stream(backend: ComputeBackend) -> None:
    assert backend.current_stream is backend.default_stream
    s = backend.create_stream()
    assert s.device == backend.device
    with backend.use_stream(s) as used:
        assert used is s
        assert backend.current_stream is s
    assert backend.current_stream is backend.default_stream


def _slow_on(backend: ComputeBackend, stream: object, n: int = 512) -> accelkit.Tensor:
    """J/n (every entry 1/n, exact in f32 for n a power of two) after a chain of matmuls queued
    on ``stream``: work that is still running when the caller's next submissions arrive."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    j = f.full((n, n), 1.0 / n)
    with backend.use_stream(stream):  # type: ignore[arg-type]
        y = j
        for _ in range(6):
            y = ops.matmul(y, j)
    return y


async def test_a_write_through_a_view_on_another_stream_is_a_write_of_the_viewed_tensor(
    backend: ComputeBackend,
) -> None:
    """A copy into a reshape of ``x`` queued on another stream after slow work: an op on
    the default stream reading ``x`` waits for it, and so does ``x.to_host()`` (both read zeros
    when only ``x``'s own writer was waited for)."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    n = 512
    expect = np.full(n * n, 1.0 / n, np.float32)
    s2 = backend.create_stream()
    for read in ("op", "to_host"):
        x = f.zeros((n * n,))
        await backend.synchronize()
        y = _slow_on(backend, s2, n)
        with backend.use_stream(s2):
            mm.copy_dtod(ops.reshape(x, (n, n)), y)
        if read == "op":
            got = await ops.add(x, 0.0).to_host()
        else:
            got = await x.to_host()
        np.testing.assert_array_equal(got, expect, err_msg=f"read by {read}")


async def test_two_writes_of_a_tensor_on_two_streams_land_in_submission_order(
    backend: ComputeBackend,
) -> None:
    """``copy_dtod`` into ``x`` on another stream after slow work, then into ``x`` on the
    default stream: the second write waits for the first, so ``x`` holds the second's data."""
    f, mm = backend.tensor_factory, backend.memory_manager
    n = 512
    x, twos = f.zeros((n, n)), f.full((n, n), 2.0)
    await backend.synchronize()
    s2 = backend.create_stream()
    y = _slow_on(backend, s2, n)
    with backend.use_stream(s2):
        mm.copy_dtod(x, y)
    mm.copy_dtod(x, twos)
    await backend.synchronize()
    np.testing.assert_array_equal(await x.to_host(), np.full((n, n), 2.0, np.float32))


async def test_a_raw_buffer_written_on_another_stream_is_read_after_the_write(
    backend: ComputeBackend,
) -> None:
    """``copy_dtod`` into a raw buffer (``memory_manager.allocate``) on another stream after
    slow work, then a read of the buffer from the default stream, by the host and by a copy:
    each waits for the write (both returned the old contents: a raw buffer's writer was not
    recorded); and a host write into it after a queued copy is not overwritten by the copy."""
    mm = backend.memory_manager
    n = 512
    expect = np.full(n * n, 1.0 / n, np.float32)
    s2 = backend.create_stream()
    for read in ("copy_dtoh", "copy_dtod", "copy_htod after"):
        buf = mm.allocate(n * n * 4)
        await mm.copy_htod(buf, np.zeros(n * n, np.float32))
        y = _slow_on(backend, s2, n)
        with backend.use_stream(s2):
            mm.copy_dtod(buf, y)
        host = np.empty(n * n, np.float32)
        if read == "copy_dtoh":
            await mm.copy_dtoh(host, buf)
        elif read == "copy_dtod":
            other = mm.allocate(n * n * 4)
            mm.copy_dtod(other, buf)
            await mm.copy_dtoh(host, other)
            mm.free(other)
        else:
            expect = np.full(n * n, 3.0, np.float32)
            await mm.copy_htod(buf, expect)
            await s2.synchronize()  # the queued copy has run: it must have run before
            await mm.copy_dtoh(host, buf)
        np.testing.assert_array_equal(host, expect, err_msg=read)
        mm.free(buf)


async def _read_into(x: accelkit.Tensor, got: list[np.ndarray]) -> None:
    got.append(await x.to_host())


async def test_a_free_while_to_host_copies_keeps_the_block_until_the_copy_is_done(
    backend: ComputeBackend,
) -> None:
    """``free(x)`` while another task's ``x.to_host()`` copies it (64 MiB: a copy of
    milliseconds), then a tensor of the same size: the free is stream-ordered, so the new tensor
    does not get ``x``'s block before the copy has read it (the copy returned the new tensor's
    sevens where its block was handed on at once). Also with the new tensor read at once, in
    the reading task's group: WebGPU, whose read maps the block on a worker thread, returned
    the new tensor's data 1 time in 10 to 6 in 10."""
    f, mm = backend.tensor_factory, backend.memory_manager
    n = 16 << 20
    for trial in range(4):
        x = f.zeros((n,))
        await backend.synchronize()
        got: list[np.ndarray] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_into, x, got)
            if trial:
                await anyio.lowlevel.checkpoint()
                await anyio.lowlevel.checkpoint()  # the read has been submitted
            else:
                await anyio.sleep(0.005)  # the copy has begun
            mm.free(x)
            y = f.full((n,), 7.0)  # the same size class as x's block
            if trial:
                await y.to_host()
        del x
        assert int(np.count_nonzero(got[0])) == 0, f"trial {trial}"
        np.testing.assert_array_equal((await y.to_host())[:: 1 << 16], 7.0)


async def test_a_partial_copy_writes_the_start_and_keeps_the_rest(backend: ComputeBackend) -> None:
    """copy_htod and copy_dtod of fewer bytes than the destination: the data goes into its
    start and the bytes after it are kept (Dask replaced the whole block, dropping them; WebGPU
    overwrote up to three bytes past a size that is not a multiple of 4)."""
    f, mm = backend.tensor_factory, backend.memory_manager
    ten = np.arange(10, dtype=np.float32)
    want = np.concatenate([np.full(4, -1.0, np.float32), ten[4:]])
    buf = mm.allocate(40)
    await mm.copy_htod(buf, ten)
    await mm.copy_htod(buf, np.full(4, -1.0, np.float32))
    out = np.zeros(10, np.float32)
    await mm.copy_dtoh(out, buf)
    np.testing.assert_array_equal(out, want, err_msg="buffer, copy_htod")
    t = f.from_host(ten)
    await mm.copy_htod(t, np.full(4, -1.0, np.float32))
    np.testing.assert_array_equal(await t.to_host(), want, err_msg="tensor, copy_htod")
    big = f.from_host(ten)
    mm.copy_dtod(big, f.full((4,), -1.0))
    np.testing.assert_array_equal(await big.to_host(), want, err_msg="tensor, copy_dtod")
    if DType.U8 in backend.capabilities.dtypes:
        u8 = f.from_host(np.arange(1, 9, dtype=np.uint8))
        await mm.copy_htod(u8, np.full(5, 200, np.uint8))
        np.testing.assert_array_equal(await u8.to_host(), [200] * 5 + [6, 7, 8])


def _new_threads(before: set[threading.Thread]) -> list[str]:
    """The threads started since ``before`` that are still alive (anyio's and trio's idle
    worker threads, which outlive their work by design, aside)."""
    return sorted(
        t.name
        for t in threading.enumerate()
        if t not in before and not t.name.startswith(("AnyIO worker thread", "Trio thread"))
    )


async def _no_new_threads(before: set[threading.Thread]) -> None:
    with anyio.move_on_after(10):  # threads end shortly after shutdown returns
        while _new_threads(before):  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert _new_threads(before) == []


async def test_initialize_and_shutdown_called_at_once_run_one_after_the_other(
    backend: ComputeBackend,
) -> None:
    """Two initializes at once opened the device twice (the first one's threads and processes
    leaked past shutdown); a shutdown during an initialize returned at once, and the backend
    ended ready; two shutdowns at once closed the device under each other (one raised)."""
    b = accelkit.create_backend(backend.name)
    await b.initialize()  # a library's process-wide threads start on a first use (Dask's)
    np.testing.assert_array_equal(await fetch(b.tensor_factory.full((3,), 2.0)), 2.0)
    await b.shutdown()
    before = set(threading.enumerate())
    b = accelkit.create_backend(backend.name)
    async with anyio.create_task_group() as tg:
        tg.start_soon(b.initialize)
        tg.start_soon(b.initialize)
    assert b.status.state is LifecycleState.READY
    np.testing.assert_array_equal(await fetch(b.tensor_factory.full((3,), 2.0)), 2.0)
    x = b.tensor_factory.ones((256, 256))
    for _ in range(4):
        x = b.tensor_ops.matmul(x, x)  # queued work for the shutdowns to drain
    async with anyio.create_task_group() as tg:
        tg.start_soon(b.shutdown)
        tg.start_soon(b.shutdown)
    state: LifecycleState = b.status.state  # (mypy narrowed it to READY above)
    assert state is LifecycleState.SHUT_DOWN
    await _no_new_threads(before)

    b = accelkit.create_backend(backend.name)
    async with anyio.create_task_group() as tg:
        tg.start_soon(b.initialize)
        # until the initialize has begun (the flag every StreamBackend has) or ended (one that
        # never yields to the loop): a shutdown before it began would rightly come first
        while getattr(b, "_lifecycle", True) is None and not b.is_ready:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        await b.shutdown()  # waits for it, then shuts down
    assert b.status.state is LifecycleState.SHUT_DOWN
    await _no_new_threads(before)


async def test_components_kept_across_a_shutdown_serve_the_next_session(
    backend: ComputeBackend,
) -> None:
    """``f = backend.tensor_factory`` (and the others) held across ``shutdown`` and a new
    ``initialize`` work on the new session, as the backend's own do (an isolated backend's
    sent to its old, closed worker: the await hung forever)."""
    b = accelkit.create_backend(backend.name)
    await b.initialize()
    f, ops, mm, kops = b.tensor_factory, b.tensor_ops, b.memory_manager, b.kernel_ops
    old = f.full((3,), 1.0)
    await b.shutdown()
    await b.initialize()
    try:
        with anyio.fail_after(60):
            y = ops.add(f.full((3,), 2.0), 1.0)
            np.testing.assert_array_equal(await fetch(y), 3.0)
            z = f.zeros((3,), DType.F32)
            await mm.copy_htod(z, np.arange(3, dtype=np.float32))
            back = np.empty(3, np.float32)
            await mm.copy_dtoh(back, kops.silu_mul(z, f.ones((3,))))
            want = np.arange(3) / (1 + np.exp(-np.arange(3.0)))
            np.testing.assert_allclose(back, want, rtol=1e-5, atol=1e-6)
        with pytest.raises(StaleHandleError):  # a tensor of the old session stays stale
            ops.add(old, 1.0)
    finally:
        await b.shutdown()


async def test_work_submitted_while_shutdown_drains_still_reports_its_error(
    backend: ComputeBackend,
) -> None:
    """A request in flight while its backend shuts down: shutdown waits for the work queued
    when it began without raising its errors, and the request's work, submitted meanwhile,
    still runs and reports its own error at its await (all errors were dropped at shutdown, and
    the request read uninitialized memory)."""
    b = accelkit.create_backend(backend.name)
    await b.initialize()
    f, ops = b.tensor_factory, b.tensor_ops
    x = f.ones((1024, 1024))
    for _ in range(16):  # a drain of a few hundred ms at least
        x = ops.matmul(x, f.full((1024, 1024), 1.0 / 1024))
    weight, index = f.ones((7, 4)), f.from_host([0, 9, 2])
    outcome: list[BaseException | None] = []

    async def request() -> None:
        try:
            y = ops.embedding(index, weight)  # submitted while shutdown waits for the matmuls
            await y.to_host()
        except AccelError as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    shut = anyio.Event()

    async def shutdown() -> None:
        await b.shutdown()
        shut.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(shutdown)
        # Until shutdown has begun (the flag every StreamBackend has), or has ended already (a
        # backend whose shutdown holds the loop throughout: the request is then refused).
        with anyio.fail_after(60):
            while not getattr(b, "_closing", True) and not shut.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.001)
        tg.start_soon(request)
    assert b.status.state is LifecycleState.SHUT_DOWN
    # Never a silent success. A backend whose reads need what shutdown closed (Dask's client)
    # may raise that instead; the others raise the kernel's error.
    assert outcome[0] is not None
    if isinstance(outcome[0], InvalidArgumentError):
        assert "9" in str(outcome[0])
    else:
        assert isinstance(outcome[0], AccelError)
