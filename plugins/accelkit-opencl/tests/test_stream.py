from __future__ import annotations

import time

import anyio
import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend
from accelkit_opencl.stream import CLEvent

from accelkit.errors import InvalidArgumentError

pytestmark = pytest.mark.anyio

SLOW = """
__kernel void spin(__global float* x, int iters) {
    int i = get_global_id(0);
    float v = x[i];
    for (int k = 0; k < iters; ++k) v = v * 0.999999f + 0.000001f;
    x[i] = v + 1.0f;
}
"""


async def test_events_complete_in_stream_order(backend: OpenCLBackend) -> None:
    s = backend.create_stream()
    with backend.use_stream(s):
        x = backend.tensor_factory.zeros((1000,))
        y = x + 1
        e1 = s.record_event()
        z = y * 3
        e2 = s.record_event()
    assert isinstance(e1, CLEvent)
    await e2.wait()
    assert e1.query()
    assert e2.query()
    assert s.query()
    np.testing.assert_array_equal(await z.to_host(), np.full(1000, 3.0))


async def test_wait_does_not_block_the_loop(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h = await ex.load_kernel(SLOW, "spin", language="opencl")
    x = backend.tensor_factory.zeros((4096,))
    ex.execute_kernel(h, (16,), (256,), [x, 20000])
    event = backend.default_stream.record_event()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not event.query():
            ticks += 1
            await anyio.sleep(0.001)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await event.wait()
    assert time.perf_counter() - start >= 0
    assert ticks >= 1
    np.testing.assert_allclose(await x.to_host(), np.full(4096, 1.0 + 0.0), rtol=0.1)


async def test_cross_stream_wait_event(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h = await ex.load_kernel(SLOW, "spin", language="opencl")
    s1, s2 = backend.create_stream(), backend.create_stream()
    x = backend.tensor_factory.zeros((4096,))
    await backend.synchronize()
    with backend.use_stream(s1):
        ex.execute_kernel(h, (16,), (256,), [x, 5000])
        done = s1.record_event()
    s2.wait_event(done)
    with backend.use_stream(s2):
        # reads x after s1's kernel: through the event, and through x's writer as well
        y = backend.tensor_ops.mul(x, 2.0)
    await s2.synchronize()
    assert done.query()
    np.testing.assert_allclose(await y.to_host(), 2 * (await x.to_host()))


async def test_implicit_cross_stream_dependency(backend: OpenCLBackend) -> None:
    s1, s2 = backend.create_stream(), backend.create_stream()
    with backend.use_stream(s1):
        a = backend.tensor_factory.from_host(np.arange(10000, dtype=np.float32))
        b = a + 1
    with backend.use_stream(s2):
        c = b * 2
    np.testing.assert_array_equal(await c.to_host(), (np.arange(10000) + 1) * 2)


async def test_cancelled_wait_leaves_backend_usable(backend: OpenCLBackend) -> None:
    ex = backend.kernel_executor
    h = await ex.load_kernel(SLOW, "spin", language="opencl")
    x = backend.tensor_factory.zeros((4096,))
    ex.execute_kernel(h, (16,), (256,), [x, 20000])
    with anyio.move_on_after(0.0001):
        await x.to_host()
    await backend.synchronize()
    assert backend.default_stream.query()
    assert (await x.to_host()).shape == (4096,)


async def test_wait_event_rejects_foreign_events(backend: OpenCLBackend) -> None:
    with pytest.raises(InvalidArgumentError):
        backend.default_stream.wait_event(object())  # type: ignore[arg-type]
