"""Graph capture (``backend.capture()``): a decode step recorded once and replayed after its
input changed gives the eager numbers (NumPy reference in float64, F32 tolerances), on the CPU
backend and on the example plugin (the generic replay of recorded kernel calls); and what a
capture refuses: host reads and waits inside it, a replay after shutdown, a shape change, a
nested capture, another stream; a capture cancelled mid-way leaves the backend usable."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import accelkit as ak
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
