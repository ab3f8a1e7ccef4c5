from __future__ import annotations

import gc

import numpy as np
import pytest
from accelkit_opencl.backend import OpenCLBackend

from accelkit.errors import InvalidArgumentError, OutOfMemoryError, StaleHandleError
from accelkit.memory import MemoryPoolConfig

pytestmark = pytest.mark.anyio


async def test_exact_accounting(backend: OpenCLBackend) -> None:
    mm = backend.memory_manager
    base = mm.memory_info()
    assert base.used == 0
    assert base.active_allocations == 0
    buf = mm.allocate(1000)
    t = backend.tensor_factory.zeros((10, 10), "f64")
    info = mm.memory_info()
    assert info.used == 1800
    assert info.active_allocations == 2
    assert info.peak >= 1800
    mm.free(buf)
    with pytest.raises(StaleHandleError):
        mm.free(buf)
    await backend.synchronize()
    del t
    gc.collect()
    assert mm.memory_info().used == 0
    assert mm.trim() > 0
    assert mm.memory_info().reserved == 0


async def test_limit_gives_out_of_memory(backend: OpenCLBackend) -> None:
    mm = backend.memory_manager
    mm.configure_pool(MemoryPoolConfig(limit_bytes=1 << 20))
    keep = mm.allocate(1 << 19)
    with pytest.raises(OutOfMemoryError):
        mm.allocate(1 << 20)
    assert mm.memory_info().used == 1 << 19
    mm.free(keep)


async def test_async_copies_round_trip(backend: OpenCLBackend) -> None:
    mm = backend.memory_manager
    src = np.arange(100, dtype=np.float32)
    buf = mm.allocate(src.nbytes)
    await mm.copy_htod(buf, src)
    src[:] = -1  # the copy was a snapshot
    out = np.empty(100, np.float32)
    await mm.copy_dtoh(out, buf)
    np.testing.assert_array_equal(out, np.arange(100))
    t = backend.tensor_factory.zeros((100,))
    mm.copy_dtod(t, buf)
    np.testing.assert_array_equal(await t.to_host(), np.arange(100))
    np.testing.assert_array_equal(t.numpy(), np.arange(100))
    with pytest.raises(InvalidArgumentError):
        await mm.copy_dtoh(np.empty(200, np.float32), buf)
    with pytest.raises(InvalidArgumentError):
        await mm.copy_htod(buf, np.zeros(200, np.float32))


async def test_buffers_are_reused_from_the_pool(backend: OpenCLBackend) -> None:
    f = backend.tensor_factory
    a = f.ones((1024,))
    await a.to_host()
    handle = a._data
    del a
    gc.collect()
    b = f.zeros((1024,))
    assert b._data is handle
    np.testing.assert_array_equal(await b.to_host(), np.zeros(1024))
