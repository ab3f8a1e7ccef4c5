"""No OpenCL call that can block runs on the event loop's thread.

Every PyOpenCL entry point that enqueues, builds, waits or asks an event's status is wrapped to
record the thread it runs on; the tests then check that none ran on the loop's thread (a
deterministic check, not a timing one), that submissions return at once while the stream's
submitter is busy, that errors in the submitter come back as accelkit errors, that order holds
across streams, and that cancellation and shutdown leave nothing behind.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pyopencl as cl
import pytest
from accelkit_opencl.backend import OpenCLBackend
from accelkit_opencl.stream import CLEvent
from accelkit_opencl.submit import launch

from accelkit.errors import AccelError, DeviceError, KernelCompileError

pytestmark = pytest.mark.anyio

SPIN = """
__kernel void spin(__global float* x, int iters) {
    int i = get_global_id(0);
    float v = x[i];
    for (int k = 0; k < iters; ++k) v = v * 0.999999f + 0.000001f;
    x[i] = v + 1.0f;
}
"""


class Spy:
    """Records (name, thread id) of every wrapped PyOpenCL call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, threading.get_ident()))
            return fn(*args, **kwargs)

        return wrapper

    def on(self, thread: int) -> list[str]:
        return [name for name, ident in self.calls if ident == thread]

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.calls}


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    s = Spy()
    for name in (
        "enqueue_nd_range_kernel",
        "enqueue_copy",
        "enqueue_fill_buffer",
        "enqueue_marker",
        "enqueue_barrier",
        "wait_for_events",
    ):
        monkeypatch.setattr(cl, name, s.wrap(name, getattr(cl, name)))
    for cls, attr in (
        (cl.Program, "build"),
        (cl.Kernel, "set_args"),
        (cl.Event, "wait"),
        (cl.Event, "set_callback"),
        (cl.Event, "get_info"),
        (cl.Event, "get_profiling_info"),
        (cl.CommandQueue, "flush"),
        (cl.CommandQueue, "finish"),
    ):
        monkeypatch.setattr(cls, attr, s.wrap(f"{cls.__name__}.{attr}", getattr(cls, attr)))
    status = cl.Event.command_execution_status
    monkeypatch.setattr(
        cl.Event,
        "command_execution_status",
        property(s.wrap("Event.command_execution_status", status.fget)),
    )
    return s


def _gate(backend: OpenCLBackend) -> threading.Event:
    """Hold the current stream's submitter until the returned event is set."""
    gate = threading.Event()

    def hold(queue: Any, wait_for: list[Any] | None) -> Any:
        gate.wait(30)
        return None

    out = backend.tensor_factory.empty((1,))
    backend.tensor_ops.kernels.launch(hold, (), (out,))  # type: ignore[attr-defined]
    return gate


async def test_no_opencl_call_on_the_loop_thread(backend: OpenCLBackend, spy: Spy) -> None:
    loop_thread = threading.get_ident()
    f, mm = backend.tensor_factory, backend.memory_manager
    s1, s2 = backend.create_stream(), backend.create_stream()  # idle: nothing to wait for
    late: list[float] = []
    running = True

    async def heartbeat() -> None:
        while running:
            t0 = time.perf_counter()
            await anyio.sleep(0.001)
            late.append(time.perf_counter() - t0 - 0.001)

    big = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        x = f.from_host(big)  # 16 MiB
        r = f.normal((64, 1024), seed=5)
        u = f.uniform((64, 1024), -1.0, 1.0, seed=6)
        z = r
        for _ in range(100):
            z = z * 0.5 + u  # every kernel is built cold (this backend's first use)
        h = f.arange(0, 4096, 1, dtype="i16")  # a dtype used nowhere else: a cold build
        h2 = h + h
        y = x * 2.0
        e = backend.default_stream.record_event()
        s1.wait_event(e)
        with backend.use_stream(s1):
            w = y + 1.0  # on another stream, after y's writer
        with backend.use_stream(s2):
            v = w - 1.0
        buf = mm.allocate(1024)
        await mm.copy_htod(buf, np.arange(256, dtype=np.float32))
        t = f.zeros((256,))
        mm.copy_dtod(t, buf)
        back = np.empty(256, np.float32)
        await mm.copy_dtoh(back, buf)
        mm.free(buf)
        got_v = await v.to_host()  # 16 MiB back
        got_z = await z.to_host()
        got_h2 = await h2.to_host()
        got_t = await t.to_host()
        await e.wait()
        await backend.synchronize()
        assert mm.memory_info().used > 0
        running = False

    on_loop = spy.on(loop_thread)
    assert on_loop == [], f"OpenCL calls on the loop's thread: {sorted(set(on_loop))}"
    assert {
        "enqueue_nd_range_kernel",
        "enqueue_copy",
        "enqueue_fill_buffer",
        "enqueue_marker",
        "Program.build",
        "Kernel.set_args",
        "Event.wait",
    } <= spy.names  # the instruments saw the work (on other threads)

    one = np.float32(1.0)
    np.testing.assert_array_equal(got_v, (big * np.float32(2.0) + one) - one)
    rz = np.random.default_rng(5).normal(size=(64, 1024)).astype(np.float32)
    ru = np.random.default_rng(6).uniform(-1.0, 1.0, size=(64, 1024)).astype(np.float32)
    np.testing.assert_array_equal(await r.to_host(), rz)
    expect = rz
    for _ in range(100):
        expect = expect * np.float32(0.5) + ru
    np.testing.assert_allclose(got_z, expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_h2, (np.arange(4096) * 2).astype(np.int16))
    np.testing.assert_array_equal(got_t, np.arange(256))
    np.testing.assert_array_equal(back, np.arange(256))
    late.sort()
    if late:
        print(f"heartbeat lateness: p50 {late[len(late) // 2] * 1e3:.2f} ms,"
              f" p99 {late[int(len(late) * 0.99)] * 1e3:.2f} ms, max {late[-1] * 1e3:.2f} ms")  # fmt: skip


async def test_submissions_return_while_the_submitter_is_busy(backend: OpenCLBackend) -> None:
    f = backend.tensor_factory
    src = np.arange(512 * 1024, dtype=np.float64)  # 4 MiB: converted by the submitter
    gate = _gate(backend)
    try:
        t0 = time.perf_counter()
        x = f.from_host(src, dtype="f32")
        src[:] = -1.0  # from_host took a snapshot
        n = f.normal((256, 256), seed=3)
        y = x + 1.0
        elapsed = time.perf_counter() - t0
        assert not backend.default_stream.query()
        assert elapsed < 5.0  # nothing waited for the held submitter
    finally:
        gate.set()
    np.testing.assert_array_equal(await y.to_host(), np.arange(512 * 1024, dtype=np.float32) + 1)
    expected = np.random.default_rng(3).normal(size=(256, 256)).astype(np.float32)
    np.testing.assert_array_equal(await n.to_host(), expected)


async def test_a_failing_command_is_an_accelkit_error_at_await(backend: OpenCLBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(16, dtype=np.float32))
    out = f.empty((16,))

    def bad_copy(queue: Any, wait_for: list[Any] | None) -> Any:
        # a real OpenCL error: more bytes than the buffers have
        return cl.enqueue_copy(queue, out._data, x._data, byte_count=1 << 40, wait_for=wait_for)

    ops.kernels.launch(bad_copy, [x], [out])  # type: ignore[attr-defined]
    with pytest.raises(DeviceError) as info:
        await out.to_host()
    assert not isinstance(info.value, cl.Error)
    assert "OpenCL" in str(info.value)
    # Reported once; the stream goes on.
    np.testing.assert_array_equal(await (x + 1.0).to_host(), np.arange(16) + 1)
    await backend.synchronize()

    # An internal kernel that does not build: KernelCompileError (with the log) at the await.
    broken = backend._kernel("__kernel void broken(__global float* x) { x[0] = nope; }", "broken")
    y = f.empty((4,))
    ops.kernels.launch(launch(broken, [y._data], (1,), None), [], [y])  # type: ignore[attr-defined]
    z = y + 1.0  # runs after the failed command, and waits for nothing that hangs
    with pytest.raises(KernelCompileError) as compile_info:
        await z.to_host()
    assert compile_info.value.log
    await backend.synchronize()  # reported already

    # A failure that nobody awaited is raised by synchronize, as an accelkit error.
    def raises(queue: Any, wait_for: list[Any] | None) -> Any:
        raise ValueError("boom")

    ops.kernels.launch(raises, [], [f.empty((1,))])  # type: ignore[attr-defined]
    with pytest.raises(DeviceError, match="boom"):
        await backend.synchronize()
    ops.kernels.launch(raises, [], [f.empty((1,))])  # type: ignore[attr-defined]
    with pytest.raises(DeviceError, match="boom"):
        backend.default_stream.synchronize_blocking()  # type: ignore[attr-defined]
    await backend.synchronize()


async def test_a_failure_on_one_stream_does_not_hang_another(backend: OpenCLBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    s1, s2 = backend.create_stream(), backend.create_stream()
    with backend.use_stream(s1):
        a = f.empty((8,))

        def fail(queue: Any, wait_for: list[Any] | None) -> Any:
            raise cl.LogicError("injected")

        ops.kernels.launch(fail, [], [a])  # type: ignore[attr-defined]
    with backend.use_stream(s2):
        b = a + 1.0  # depends on the failed position of s1
    assert (await b.to_host()).shape == (8,)
    with pytest.raises(DeviceError) as info:
        await s1.synchronize()
    assert not isinstance(info.value, cl.Error)


async def test_order_across_streams(backend: OpenCLBackend) -> None:
    ex, f, mm = backend.kernel_executor, backend.tensor_factory, backend.memory_manager
    assert ex is not None
    h = await ex.load_kernel(SPIN, "spin", language="opencl")
    s1, s2 = backend.create_stream(), backend.create_stream()
    with backend.use_stream(s1):
        a = f.zeros((4096,))
        ex.execute_kernel(h, (16,), (256,), [a, 20000])  # slow
    with backend.use_stream(s2):
        b = a * 2.0  # after s1's kernel (the writer of a)
    with backend.use_stream(s1):
        c = b + 1.0  # after s2's multiplication
    with backend.use_stream(s2):
        d = c * 3.0
    spun = await a.to_host()
    np.testing.assert_allclose(await d.to_host(), (spun * 2 + 1) * 3, rtol=1e-6)

    # An event orders a buffer that no tensor tracks.
    buf = mm.allocate(4096 * 4)
    await mm.copy_htod(buf, np.zeros(4096, np.float32))
    with backend.use_stream(s1):
        start = s1.record_event()
        ex.execute_kernel(h, (16,), (256,), [buf, 20000])
        done = s1.record_event()
    s2.wait_event(done)
    with backend.use_stream(s2):
        t = f.empty((4096,))
        mm.copy_dtod(t, buf)
    got = await t.to_host()
    assert done.query()
    assert isinstance(done, CLEvent)
    np.testing.assert_array_equal(got, spun)
    assert start.elapsed_ms(done) >= 0.0  # both complete: no wait


async def test_cancelled_waits_leave_the_backend_consistent(backend: OpenCLBackend) -> None:
    ex, f, mm = backend.kernel_executor, backend.tensor_factory, backend.memory_manager
    assert ex is not None
    h = await ex.load_kernel(SPIN, "spin", language="opencl")
    await backend.synchronize()
    gc.collect()
    base = mm.memory_info().used
    x = f.zeros((4096,))
    ex.execute_kernel(h, (16,), (256,), [x, 50000])
    with anyio.move_on_after(0.0001):
        await x.to_host()
    host = np.ones(1 << 19, np.float32)  # 2 MiB: the snapshot runs on a worker thread
    buf = mm.allocate(host.nbytes)
    with anyio.move_on_after(0.0001):
        await mm.copy_htod(buf, host)
    with anyio.move_on_after(0.0001):
        await mm.copy_dtoh(np.empty_like(host), buf)
    with anyio.move_on_after(0):
        await backend.default_stream.synchronize()
    await backend.synchronize()
    assert backend.default_stream.query()
    assert (await x.to_host()).shape == (4096,)
    mm.free(buf)
    del x
    gc.collect()
    assert mm.memory_info().used == base


async def test_threads_end_with_the_backend() -> None:
    async def cycle() -> None:
        b = OpenCLBackend()
        await b.initialize("opencl:0")
        try:
            s = b.create_stream()
            x = b.tensor_factory.ones((64,))
            with b.use_stream(s):
                y = x + 1.0
            assert (await y.to_host())[0] == 2.0
        finally:
            await b.shutdown()

    def ours() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("accelkit-opencl")]

    await cycle()  # worker threads of anyio and the driver start here
    baseline = threading.active_count()
    for _ in range(3):
        await cycle()
    assert ours() == []
    assert threading.active_count() <= baseline


async def test_errors_are_accel_errors_not_pyopencl_ones(backend: OpenCLBackend) -> None:
    # What synchronize raises after a failed command is always an AccelError.
    out = backend.tensor_factory.empty((1,))

    def fail(queue: Any, wait_for: list[Any] | None) -> Any:
        return cl.enqueue_fill_buffer(queue, out._data, np.zeros(1, np.float32), 0, 1 << 40)

    backend.tensor_ops.kernels.launch(fail, [], [out])  # type: ignore[attr-defined]
    with pytest.raises(AccelError) as info:
        await backend.synchronize()
    assert not isinstance(info.value, cl.Error)


async def test_create_stream_and_free_while_the_submitter_is_busy(backend: OpenCLBackend) -> None:
    f, mm = backend.tensor_factory, backend.memory_manager
    x = f.from_host(np.arange(1024, dtype=np.float32))
    gate = _gate(backend)  # the default stream's submitter is held: nothing enqueued after this
    try:
        y = x * 2.0
        t0 = time.perf_counter()
        s = backend.create_stream()  # must start after the work queued so far: never waits
        buf = mm.allocate(4096)
        handle = buf.handle
        mm.free(buf)  # with two streams: back to the pool once the work queued so far is done
        assert time.perf_counter() - t0 < 5.0
        other = mm.allocate(4096)
        assert other.handle is not handle  # not yet
        with backend.use_stream(s):
            z = y + 1.0
    finally:
        gate.set()
    np.testing.assert_array_equal(await z.to_host(), np.arange(1024) * 2 + 1)
    await backend.synchronize()
    assert backend.default_stream.query()
    assert s.query()
    mm.memory_info()  # settles: the freed block is back
    assert mm.allocate(4096).handle is handle
    mm.free(other)


async def test_threads_end_when_idle_and_come_back(
    backend: OpenCLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import accelkit_opencl.stream as stream_module

    monkeypatch.setattr(stream_module, "_IDLE_EXIT", 0.05)
    s = backend.create_stream()
    with backend.use_stream(s):
        x = backend.tensor_factory.ones((16,))
    await s.synchronize()

    def alive() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.endswith(s.name)]

    for _ in range(100):
        if not alive():
            break
        await anyio.sleep(0.02)
    assert alive() == []
    with backend.use_stream(s):
        y = x + 1.0
    np.testing.assert_array_equal(await y.to_host(), np.full(16, 2.0))
