"""Graph capture (``backend.capture()``): a decode step recorded once and replayed after its
input changed gives the eager numbers (NumPy reference in float64, F32 tolerances), on the CPU
backend and on the example plugin (the generic replay of recorded kernel calls); and what a
capture refuses: host reads and waits inside it, a replay after shutdown, a shape change, a
nested capture, another stream; a capture cancelled mid-way leaves the backend usable."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import accelkit as ak
from accelkit._core.host_memory import OFF_LOOP_COPY_BYTES
from accelkit.errors import CaptureError, StaleHandleError, UnsupportedOperationError
from accelkit.testing.fixtures import backend_fixture
from accelkit.testing.graphs import decode_reference, decode_step, make_decode_step, tolerance

pytestmark = pytest.mark.anyio

pytest.importorskip("accelkit_example", reason="the example plugin is not installed")

#: The decode step on the CPU backend and on the example plugin (an SDK-only backend).
backend = backend_fixture(params=["cpu", "example"])


async def _capture(backend: ak.ComputeBackend, body: Callable[[], Awaitable[object]]) -> None:
    """Run ``body`` inside a capture (one statement for ``pytest.raises``)."""
    async with backend.capture():
        await body()


def _close(got: Any, want: Any) -> None:
    tol = tolerance()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


async def test_replay_matches_eager_after_the_input_changes(backend: ak.ComputeBackend) -> None:
    step = make_decode_step(backend)
    async with backend.capture() as graph:
        y = decode_step(backend, step)
    assert graph.kind == "calls"
    assert graph.num_calls >= 5
    assert any(t is step.x for t in graph.inputs)
    assert any(t is y for t in graph.outputs)
    # The capture ran the step once, as eager code would have.
    _close(await y.to_host(), decode_reference(step.host, step.host["x"]))
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((1, step.host["x"].shape[1])).astype(np.float32)
        await graph.write(step.x, x)
        graph.replay()
        got = await y.to_host()
        _close(got, decode_reference(step.host, x))
        # The same step submitted eagerly, on the same input, gives the same numbers.
        _close(got, await decode_step(backend, step).to_host())


async def test_a_device_copy_feeds_the_next_replay(backend: ak.ComputeBackend) -> None:
    step = make_decode_step(backend)
    async with backend.capture() as graph:
        y = decode_step(backend, step)
    graph.replay()
    x_next = await y.to_host()
    graph.copy(step.x, y)  # the output becomes the next input, on the device
    graph.replay()
    _close(await y.to_host(), decode_reference(step.host, x_next.astype(np.float32)))


async def test_tensors_made_inside_belong_to_the_graph(backend: ak.ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(6, dtype=np.float32))
    async with backend.capture() as graph:
        ones = f.ones((6,), ak.DType.F32)
        y = ops.mul(ops.add(x, ones), 2.0)
    used = backend.memory_manager.memory_info().used
    for k in range(3):
        await graph.write(x, np.full(6, k, np.float32))
        graph.replay()
        np.testing.assert_array_equal(await y.to_host(), np.full(6, 2 * (k + 1), np.float32))
    assert backend.memory_manager.memory_info().used == used  # no allocation per replay
    await graph.write(x, np.zeros(6, np.float32))
    with pytest.raises(CaptureError, match="no tensor this graph reads"):
        await graph.write(y, np.zeros(6, np.float32))  # written by it, never read


async def test_a_host_read_inside_a_capture_is_refused(backend: ak.ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.ones(4, np.float32))
    host = np.empty(4, np.float32)

    async def numpy() -> object:
        return ops.add(x, x).numpy()

    for read in (
        lambda: ops.add(x, x).to_host(),
        lambda: backend.memory_manager.copy_dtoh(host, ops.add(x, x)),
        lambda: backend.synchronize(),
        lambda: backend.current_stream.synchronize(),
        lambda: backend.memory_manager.copy_htod(x, host),
        numpy,
    ):
        with pytest.raises(CaptureError, match="inside a graph capture"):
            await _capture(backend, read)
    # Refused captures left nothing behind: the backend submits and reads as usual.
    np.testing.assert_array_equal(await ops.add(x, x).to_host(), np.full(4, 2, np.float32))


async def test_shape_changes_are_refused(backend: ak.ComputeBackend) -> None:
    step = make_decode_step(backend)
    async with backend.capture() as graph:
        y = decode_step(backend, step)
    with pytest.raises(CaptureError, match="fixed shapes"):
        await graph.write(step.x, np.zeros((2, step.host["x"].shape[1]), np.float32))
    other = backend.tensor_factory.zeros((1, 7), ak.DType.F32)
    with pytest.raises(CaptureError, match="fixed shapes"):
        graph.copy(step.x, other)
    with pytest.raises(CaptureError, match="fixed shapes"):
        graph.copy(step.x, backend.tensor_factory.zeros(step.x.shape, ak.DType.F64))
    # Nothing changed: the graph still replays on the old input.
    graph.replay()
    _close(await y.to_host(), decode_reference(step.host, step.host["x"]))


async def test_nested_captures_and_replays_inside_a_capture_are_refused(
    backend: ak.ComputeBackend,
) -> None:
    x = backend.tensor_factory.ones((4,), ak.DType.F32)
    async with backend.capture() as graph:
        backend.tensor_ops.add(x, x)
    async with backend.capture():
        with pytest.raises(CaptureError, match="do not nest"):
            async with backend.capture():
                pass
        with pytest.raises(CaptureError, match="do not nest"):
            graph.replay()
    graph.replay()
    await backend.synchronize()


async def test_another_stream_is_refused(backend: ak.ComputeBackend) -> None:
    s = backend.create_stream()
    x = backend.tensor_factory.ones((4,), ak.DType.F32)

    async def elsewhere() -> None:
        with backend.use_stream(s):
            backend.tensor_ops.add(x, x)

    with pytest.raises(CaptureError, match="records one stream"):
        await _capture(backend, elsewhere)
    async with backend.capture() as graph:
        y = backend.tensor_ops.add(x, x)
    with backend.use_stream(s), pytest.raises(CaptureError, match="replays there only"):
        graph.replay()
    with backend.use_stream(s), pytest.raises(CaptureError, match="the current stream is"):
        graph.replay(stream=backend.default_stream)
    with pytest.raises(CaptureError, match="replays there only"):
        graph.replay(stream=s)
    graph.replay(stream=backend.default_stream)
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 2, np.float32))


async def test_another_task_on_another_stream_runs_during_a_capture(
    backend: ak.ComputeBackend,
) -> None:
    s = backend.create_stream()
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(4, dtype=np.float32))
    seen: list[Any] = []
    inside = anyio.Event()
    done = anyio.Event()

    async def other() -> None:  # started before the capture: not part of it
        await inside.wait()
        with backend.use_stream(s):
            seen.append(await ops.mul(x, 3.0).to_host())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with backend.capture() as graph:
            y = ops.add(x, 1.0)
            inside.set()
            await done.wait()
    assert graph.num_calls == 1  # the other task's mul is not in the graph
    np.testing.assert_array_equal(seen[0], np.arange(4) * 3.0)
    await graph.write(x, np.ones(4, np.float32))
    graph.replay()
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 2, np.float32))


async def test_a_cancelled_capture_leaves_the_backend_usable(backend: ak.ComputeBackend) -> None:
    x = backend.tensor_factory.ones((4,), ak.DType.F32)
    graph = None
    with anyio.move_on_after(0.05):
        async with backend.capture() as graph:
            backend.tensor_ops.add(x, x)
            await anyio.sleep(10)
    assert graph is not None
    with pytest.raises(CaptureError, match="did not complete"):
        graph.replay()
    y = backend.tensor_ops.add(x, x)
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 2, np.float32))
    async with backend.capture() as again:  # a new capture opens
        z = backend.tensor_ops.mul(x, 5.0)
    again.replay()
    np.testing.assert_array_equal(await z.to_host(), np.full(4, 5, np.float32))


async def test_a_failed_capture_is_not_replayable(backend: ak.ComputeBackend) -> None:
    x = backend.tensor_factory.ones((4,), ak.DType.F32)
    with pytest.raises(ak.InvalidArgumentError, match="unknown unary op"):
        async with backend.capture() as graph:
            backend.tensor_ops.unary("nope", x)
    with pytest.raises(CaptureError, match="did not complete"):
        graph.replay()


async def test_the_capture_block_is_entered_once(backend: ak.ComputeBackend) -> None:
    cap = backend.capture()
    async with cap:
        pass
    with pytest.raises(CaptureError, match="entered once"):
        async with cap:
            pass


@pytest.fixture
async def fresh(anyio_backend: str) -> AsyncIterator[ak.ComputeBackend]:
    b = ak.create_backend("cpu")
    await b.initialize()
    yield b
    await b.shutdown()


async def test_replay_after_shutdown_is_stale(fresh: ak.ComputeBackend) -> None:
    x = fresh.tensor_factory.ones((4,), ak.DType.F32)
    async with fresh.capture() as graph:
        fresh.tensor_ops.add(x, x)
    await fresh.shutdown()
    with pytest.raises(StaleHandleError, match="before a shutdown"):
        graph.replay()
    await fresh.initialize()  # a new session does not revive it
    with pytest.raises(StaleHandleError):
        graph.replay()
    with pytest.raises(StaleHandleError):
        await graph.write(x, np.zeros(4, np.float32))


async def test_a_backend_with_a_fallback_refuses_to_capture(fresh: ak.ComputeBackend) -> None:
    other = ak.create_backend("cpu")
    await other.initialize()
    try:
        fresh.enable_fallback(other)
        with pytest.raises(UnsupportedOperationError, match="fallback"):
            async with fresh.capture():
                pass
    finally:
        await other.shutdown()


async def test_capture_outside_initialize_is_refused() -> None:
    b = ak.create_backend("cpu")
    with pytest.raises(ak.NotInitializedError):
        b.capture()


async def test_another_task_on_the_capture_stream_is_not_recorded(
    backend: ak.ComputeBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(4, dtype=np.float32))
    inside, done = anyio.Event(), anyio.Event()
    seen: list[Any] = []

    async def other() -> None:  # on the default stream too, started before the capture
        await inside.wait()
        seen.append(await ops.sub(x, 1.0).to_host())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with backend.capture() as graph:
            y = ops.mul(x, 2.0)
            inside.set()
            await done.wait()
    assert graph.num_calls == 1
    np.testing.assert_array_equal(seen[0], np.arange(4) - 1.0)
    await graph.write(x, np.full(4, 3, np.float32))
    graph.replay()
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 6, np.float32))


async def test_a_graph_whose_tensor_was_freed_is_stale(backend: ak.ComputeBackend) -> None:
    """A freed block goes to the next allocation: a replay would write into (or read) another
    tensor's memory. The graph refuses every use once one of its tensors is freed."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    x = f.from_host(np.arange(256, dtype=np.float32))
    async with backend.capture() as graph:
        y = ops.add(x, 1.0)
    mm.free(y)
    z = f.from_host(np.full(256, 7, np.float32))  # may take y's block
    with pytest.raises(StaleHandleError, match=r"a tensor this graph writes \(\(256,\) f32\)"):
        graph.replay()
    np.testing.assert_array_equal(await z.to_host(), np.full(256, 7, np.float32))

    async with backend.capture() as graph:
        ops.mul(x, 2.0)
    mm.free(x)
    with pytest.raises(StaleHandleError, match="a tensor this graph reads"):
        graph.replay()
    with pytest.raises(StaleHandleError, match="was freed after the capture"):
        await graph.write(x, np.zeros(256, np.float32))


async def test_a_capture_inside_another_backend_s_capture_says_which_is_open(
    backend: ak.ComputeBackend,
) -> None:
    """It said "already open on this backend" of a backend with no capture."""
    async with ak.open_backend("cpu" if backend.name != "cpu" else "example") as other:
        async with backend.capture():
            with pytest.raises(CaptureError, match=f"a graph capture on {backend.name} is open"):
                async with other.capture():
                    pass
        async with other.capture():  # nothing left open
            pass


async def test_to_device_inside_a_capture_is_refused(backend: ak.ComputeBackend) -> None:
    """It read another backend's tensor and froze its value into the graph as a constant; so
    did ``from_dlpack`` of a tensor (of any backend)."""
    async with ak.open_backend("cpu" if backend.name != "cpu" else "example") as other:
        src = other.tensor_factory.from_host(np.ones(4, np.float32))
        async with backend.capture():
            with pytest.raises(CaptureError, match="to_device"):
                await backend.tensor_factory.to_device(src)
            with pytest.raises(CaptureError, match="from_dlpack"):
                backend.tensor_factory.from_dlpack(src)
            backend.tensor_factory.from_dlpack(np.ones(4, np.float32))  # a host array: a constant
        got = await backend.tensor_factory.to_device(src)  # after the block: fine
        np.testing.assert_array_equal(await got.to_host(), np.ones(4, np.float32))


async def test_a_graph_whose_raw_buffer_was_freed_is_stale(backend: ak.ComputeBackend) -> None:
    """A copy into a raw DeviceBuffer (``copy_dtod(buffer, tensor)``) is recorded with its
    buffer: freed, and its block handed to a new tensor, a replay wrote into that tensor (the
    graph only watched tensors)."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    x = f.from_host(np.arange(4, dtype=np.float32))
    buf = mm.allocate(16)
    async with backend.capture() as graph:
        mm.copy_dtod(buf, ops.add(x, 1.0))
    graph.replay()  # the buffer is alive: fine
    mm.free(buf)
    z = f.from_host(np.full(4, 7, np.float32))  # may take buf's block
    with pytest.raises(StaleHandleError, match=r"a buffer this graph uses \(16 bytes\)"):
        graph.replay()
    np.testing.assert_array_equal(await z.to_host(), np.full(4, 7, np.float32))


async def test_a_call_running_on_another_thread_hides_none_of_the_tasks_calls(
    backend: ak.ComputeBackend,
) -> None:
    """from_host_async copies a large array on a worker thread, as a recorded call; the calls
    the capturing task makes meanwhile on the loop's thread are recorded all the same."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(4, dtype=np.float32))
    big = np.ones(OFF_LOOP_COPY_BYTES // 4, np.float32)
    kernels: Any = f.kernels
    real = kernels.from_host
    release = threading.Event()
    inside = anyio.Event()
    token = anyio.lowlevel.current_token()

    def held_from_host(*args: Any, **kwargs: Any) -> Any:  # the worker's copy, held open
        if not release.is_set():  # (the replay calls it too, on the loop's thread)
            anyio.from_thread.run_sync(inside.set, token=token)
            assert release.wait(10)
        return real(*args, **kwargs)

    uploaded: list[ak.Tensor] = []

    async def upload() -> None:
        uploaded.append(await f.from_host_async(big))

    kernels.from_host = held_from_host  # wrapped by the capture, put back when it ends
    try:
        async with backend.capture() as graph, anyio.create_task_group() as tg:
            tg.start_soon(upload)
            await inside.wait()
            y = x
            for _ in range(5):  # while the worker is inside its recorded call
                y = ops.add(y, 1.0)
            release.set()
    finally:
        release.set()
        kernels.__dict__.pop("from_host", None)
    names = [c.name for c in graph._calls]
    assert names.count("binary") == 5, names
    assert names.count("from_host") == 1, names
    await graph.write(x, np.zeros(4, np.float32))
    graph.replay()
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 5, np.float32))
    np.testing.assert_array_equal(await uploaded[0].to_host(), big)


def _adam_reference(
    p: Any, g: Any, m: Any, v: Any, lr: float, step: int, b1: float = 0.9, b2: float = 0.999
) -> Any:
    """One AdamW step without weight decay in float64 (the textbook update)."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
    return p - lr * m_hat / (np.sqrt(v_hat) + 1e-8), m, v


async def test_a_tensor_updated_in_place_is_an_input_of_the_graph(
    backend: ak.ComputeBackend,
) -> None:
    """adam_update reads and writes param, m and v: the graph reads them, so new values can be
    written into them before a replay (and a replay waits for their writers)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    rng = np.random.default_rng(5)
    host = {k: rng.standard_normal(16).astype(np.float32) for k in "pgm"}
    host["v"] = rng.random(16).astype(np.float32)
    p, g, m, v = (f.from_host(host[k]) for k in "pgmv")
    async with backend.capture() as graph:
        ops.adam_update(p, g, m, v, lr=0.1, step=3, eps=1e-8, weight_decay=0.0)
    for t in (p, g, m, v):
        assert any(u is t for u in graph.inputs)
    assert {id(t) for t in graph.outputs} == {id(p), id(m), id(v)}
    new = {k: rng.standard_normal(16).astype(np.float32) for k in "pgm"}
    new["v"] = rng.random(16).astype(np.float32)
    for k, t in zip("pgmv", (p, g, m, v), strict=True):
        await graph.write(t, new[k])
    graph.replay()
    p64, g64, m64, v64 = (new[k].astype(np.float64) for k in "pgmv")
    want = _adam_reference(p64, g64, m64, v64, lr=0.1, step=3)
    # A handful of F32 operations an element: a few units of F32 rounding, relative to the
    # terms' magnitudes (|p| and lr * |m_hat| / sqrt(v_hat) are O(1) here, up to ~50).
    tol = 64 * float(np.finfo(np.float32).eps)
    for t, w in zip((p, m, v), want, strict=True):
        got = await t.to_host()
        np.testing.assert_allclose(got, w, rtol=tol, atol=tol * float(np.abs(w).max()))


async def test_a_task_started_inside_a_capture_can_capture_later(
    backend: ak.ComputeBackend,
) -> None:
    """A child task keeps a copy of its parent's context, the capture's recorder included;
    once that capture has ended, the child opens its own."""
    x = backend.tensor_factory.ones((4,), ak.DType.F32)
    go = anyio.Event()
    graphs: list[Any] = []

    async def child() -> None:
        await go.wait()
        async with backend.capture() as g:
            graphs.append((g, backend.tensor_ops.add(x, x)))

    async with anyio.create_task_group() as tg:
        async with backend.capture():
            tg.start_soon(child)
            backend.tensor_ops.add(x, 1.0)
        go.set()
    g, y = graphs[0]
    assert g.num_calls == 1
    g.replay()
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 2, np.float32))


async def test_a_captured_from_host_replays_the_values_it_read(
    backend: ak.ComputeBackend,
) -> None:
    """from_host snapshots its array when called; its replay writes that snapshot, not what
    the caller's array holds by then (as a CUDA graph does)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    host = np.ones(4, np.float32)
    async with backend.capture() as graph:
        y = ops.add(f.from_host(host), 1.0)
    host[:] = 100
    graph.replay()
    np.testing.assert_array_equal(await y.to_host(), np.full(4, 2, np.float32))
