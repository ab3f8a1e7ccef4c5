"""The memory manager: exact accounting, the caching pool, limits, trim, peak, transfers and
release on shutdown."""

from __future__ import annotations

import gc
import random
import threading
from typing import Any, cast

import anyio
import numpy as np
import pydantic
import pytest

import accelkit
from accelkit import (
    ComputeBackend,
    DType,
    MemoryInfo,
    MemoryPoolConfig,
    MemoryPressure,
    StaleHandleError,
    Tensor,
)
from accelkit._core.pool import size_class
from accelkit.backends.cpu.backend import CPUBackend

pytestmark = pytest.mark.anyio


def _info(backend: ComputeBackend) -> MemoryInfo:
    return backend.memory_manager.memory_info()


async def test_fresh_backend_uses_nothing(backend: ComputeBackend) -> None:
    info = _info(backend)
    assert (info.used, info.active_allocations, info.peak) == (0, 0, 0)
    assert info.free == info.total > 0
    assert info.fragmentation == 0.0
    assert backend.memory_manager.pressure is MemoryPressure.LOW


async def test_used_is_the_exact_sum_of_requested_sizes(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    sizes = [0, 1, 7, 63, 64, 65, 1000, 4097, 100_000]
    buffers = [mm.allocate(n) for n in sizes]
    info = _info(backend)
    assert info.used == sum(sizes)
    assert info.active_allocations == len(sizes)
    assert info.free == info.total - info.used
    assert info.reserved >= sum(size_class(n) for n in sizes)
    assert 0.0 <= info.fragmentation < 1.0
    assert [b.nbytes for b in buffers] == sizes
    for b in buffers[:4]:
        mm.free(b)
    assert _info(backend).used == sum(sizes[4:])
    assert _info(backend).active_allocations == len(sizes) - 4


async def test_tensors_count_their_bytes_and_views_count_nothing(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.zeros((3, 5))  # 60 bytes
    b = f.ones((7,), DType.F64)  # 56 bytes
    c = f.empty((2, 2), DType.U8)  # 4 bytes
    assert _info(backend).used == 120
    view = ops.reshape(a, (15,))
    assert _info(backend).used == 120
    d = ops.add(a, 1.0)
    assert _info(backend).used == 180
    assert _info(backend).active_allocations == 4
    backend.memory_manager.free(b)
    assert _info(backend).used == 124
    del c
    assert _info(backend).used == 120  # released when the last reference goes
    del a, d
    assert _info(backend).used == 60  # the view still holds a's buffer
    del view
    assert _info(backend).used == 0


async def test_freed_blocks_are_reused_from_the_cache(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    first = mm.allocate(1000)
    address = first.handle.ctypes.data
    mm.free(first)
    info = _info(backend)
    assert info.used == 0
    assert info.reserved == size_class(1000)
    again = mm.allocate(1000)  # same size class: the cached block, not a new one
    assert _info(backend).reserved == size_class(1000)
    assert again.handle.ctypes.data == address
    other = mm.allocate(990)  # same class, but the cached block is taken: a new one
    assert _info(backend).reserved == 2 * size_class(1000)
    mm.free(again)
    mm.free(other)


async def test_tensor_memory_is_reused(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    for _ in range(50):
        t = f.ones((128, 128))
        del t
    info = _info(backend)
    assert info.used == 0
    assert info.reserved == size_class(128 * 128 * 4)


async def test_a_dropped_buffer_is_accounted_for_at_the_next_allocation(
    backend: ComputeBackend,
) -> None:
    """A buffer that dies (no ``free``) is queued and taken back at the next allocation: its
    block reused at once for the same size class, cached for another, still cached when that
    allocation is refused, and given back to the device when the cache is off."""
    mm = backend.memory_manager
    small, big = size_class(1000), size_class(5000)
    dropped = mm.allocate(1000)
    address = dropped.handle.ctypes.data
    del dropped
    again = mm.allocate(990)  # same class: the dropped block itself
    assert again.handle.ctypes.data == address
    assert (_info(backend).used, _info(backend).reserved) == (990, small)
    del again
    bigger = mm.allocate(5000)  # another class: the dropped block goes to the cache
    info = _info(backend)
    assert (info.used, info.active_allocations, info.reserved) == (5000, 1, big + small)
    reused = mm.allocate(1000)  # from the cache
    assert reused.handle.ctypes.data == address
    mm.configure_pool(MemoryPoolConfig(limit_bytes=6000))
    del reused
    with pytest.raises(accelkit.OutOfMemoryError):
        mm.allocate(1024)  # its class, but over the limit: the dropped block must not be lost
    info = _info(backend)
    assert (info.used, info.active_allocations, info.reserved) == (5000, 1, big + small)
    kept = mm.allocate(1000)
    assert kept.handle.ctypes.data == address
    mm.configure_pool(MemoryPoolConfig(limit_bytes=None, enabled=False))
    del kept
    other = mm.allocate(3000)  # no cache: the dropped block is given back, not reused
    info = _info(backend)
    assert (info.used, info.active_allocations) == (8000, 2)
    assert info.reserved == big + size_class(3000)
    mm.free(other)
    mm.free(bigger)


async def test_size_classes_waste_at_most_an_eighth() -> None:
    for n in [*range(0, 2000, 7), 4097, 65_537, 10**6 + 3, 3 * 2**30 + 1]:
        c = size_class(n)
        assert c >= n
        assert c % 64 == 0
        assert c <= max(64, n + n / 8 + 63)


async def test_ten_thousand_mixed_cycles_keep_reserved_bounded(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    rng = random.Random(7)
    sizes = [17, 100, 1000, 5000, 40_000, 250_000, 1 << 20]
    max_live = 6
    live = []
    reserved_after_warmup: Any = None  # an int from the 1000th cycle on
    for i in range(10_000):
        live.append(mm.allocate(rng.choice(sizes)))
        if len(live) > max_live or rng.random() < 0.3:
            mm.free(live.pop(rng.randrange(len(live))))
        if i == 1000:
            reserved_after_warmup = _info(backend).reserved
    info = _info(backend)
    # Bounded by what can be live at once, whatever the number of cycles.
    bound = (max_live + 1) * sum(size_class(s) for s in sizes)
    assert info.reserved <= bound
    assert info.reserved <= 2 * max(reserved_after_warmup, 1) + bound // 4
    assert info.used == sum(b.nbytes for b in live)
    for b in live:
        mm.free(b)
    info = _info(backend)
    assert info.used == 0
    assert info.active_allocations == 0
    assert info.reserved <= bound


async def test_tensor_cycles_keep_reserved_flat(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.ones((64, 64))
    ops.add(x, 1.0)  # warm up the size class
    reserved = _info(backend).reserved
    for _ in range(2000):
        y = ops.add(x, 1.0)
        del y
    assert _info(backend).reserved == reserved
    assert _info(backend).used == x.nbytes


async def test_trim_releases_cached_bytes(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    keep = mm.allocate(500)
    for n in (1000, 20_000, 300_000):
        mm.free(mm.allocate(n))
    info = _info(backend)
    cached = info.reserved - size_class(500)
    assert cached == size_class(1000) + size_class(20_000) + size_class(300_000)
    assert mm.trim() == cached
    info = _info(backend)
    assert info.reserved == size_class(500)
    assert info.used == 500
    assert mm.trim() == 0
    mm.free(keep)


async def test_peak_and_reset_peak(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    a = mm.allocate(1000)
    b = mm.allocate(2000)
    mm.free(a)
    c = mm.allocate(500)
    assert _info(backend).peak == 3000
    mm.free(b)
    assert _info(backend).peak == 3000
    mm.reset_peak()
    assert _info(backend).peak == 500
    d = mm.allocate(10)
    assert _info(backend).peak == 510
    mm.free(c)
    mm.free(d)
    assert _info(backend).peak == 510


async def test_free_twice_raises_stale_handle(backend: ComputeBackend) -> None:
    mm, f = backend.memory_manager, backend.tensor_factory
    buf = mm.allocate(128)
    mm.free(buf)
    with pytest.raises(StaleHandleError):
        mm.free(buf)
    t = f.ones((4,))
    mm.free(t)
    with pytest.raises(StaleHandleError):
        mm.free(t)
    assert _info(backend).used == 0


async def test_disabled_cache_returns_blocks_at_once(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    mm.configure_pool(MemoryPoolConfig(enabled=False))
    mm.free(mm.allocate(10_000))
    assert _info(backend).reserved == 0
    mm.configure_pool(MemoryPoolConfig())
    mm.free(mm.allocate(10_000))
    assert _info(backend).reserved == size_class(10_000)
    mm.configure_pool(MemoryPoolConfig(enabled=False))  # turning the cache off empties it
    assert _info(backend).reserved == 0


async def test_max_cached_bytes_caps_the_cache(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    mm.configure_pool(MemoryPoolConfig(max_cached_bytes=10_000))
    bufs = [mm.allocate(4000) for _ in range(5)]
    for b in bufs:
        mm.free(b)
    assert _info(backend).reserved <= 10_000
    assert _info(backend).reserved >= size_class(4000)


async def test_pressure_follows_the_limit(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    mm.configure_pool(MemoryPoolConfig(limit_bytes=10_000))
    assert _info(backend).total == 10_000
    levels = []
    bufs = []
    for n in (4000, 2000, 2000, 1500):
        bufs.append(mm.allocate(n))
        levels.append(mm.pressure)
    assert levels == [
        MemoryPressure.LOW,
        MemoryPressure.MEDIUM,
        MemoryPressure.HIGH,
        MemoryPressure.CRITICAL,
    ]
    for b in bufs:
        mm.free(b)
    assert mm.pressure is MemoryPressure.LOW


async def test_limit_below_current_use_refuses_new_allocations_only(
    backend: ComputeBackend,
) -> None:
    mm = backend.memory_manager
    keep = mm.allocate(5000)
    mm.configure_pool(MemoryPoolConfig(limit_bytes=4000))
    with pytest.raises(accelkit.OutOfMemoryError):
        mm.allocate(1)
    assert keep.is_alive
    assert _info(backend).used == 5000
    mm.free(keep)
    mm.free(mm.allocate(4000))


async def test_alignment(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    for align in (1, 8, 64):
        buf = mm.allocate(100, alignment=align)
        assert buf.handle.ctypes.data % align == 0
    for bad in (3, 48, 1 << 20):
        with pytest.raises(accelkit.InvalidArgumentError, match=str(bad)):
            mm.allocate(100, alignment=bad)


async def test_alignment_is_what_the_backend_was_created_with() -> None:
    """A config may not raise the alignment later (the allocator's blocks keep the first one:
    49 of 50 blocks missed a promised 4096), may lower it, and must be a power of two."""
    with pytest.raises(pydantic.ValidationError, match="power of two"):
        MemoryPoolConfig(alignment=3)
    async with accelkit.open_backend("cpu") as b:
        mm = b.memory_manager
        with pytest.raises(accelkit.InvalidArgumentError, match="aligned to 64 bytes"):
            mm.configure_pool(MemoryPoolConfig(alignment=4096))
        with pytest.raises(accelkit.InvalidArgumentError, match="up to 64"):
            mm.allocate(100, alignment=4096)
    small = CPUBackend(pool_config=MemoryPoolConfig(alignment=16))
    await small.initialize()
    try:  # a config that does not name the alignment keeps the pool's (it raised it to 64)
        small.memory_manager.configure_pool(MemoryPoolConfig(limit_bytes=64 << 20))
        assert small.memory_manager.pool.config.alignment == 16
    finally:
        await small.shutdown()
    b = CPUBackend(pool_config=MemoryPoolConfig(alignment=4096))
    await b.initialize()
    try:
        mm = b.memory_manager
        mm.configure_pool(MemoryPoolConfig(limit_bytes=1 << 30))  # alignment 64: less, kept
        bufs = [mm.allocate(100 + i, alignment=4096) for i in range(50)]
        assert all(buf.handle.ctypes.data % 4096 == 0 for buf in bufs)
    finally:
        await b.shutdown()


async def test_host_transfers_round_trip(backend: ComputeBackend) -> None:
    mm, f = backend.memory_manager, backend.tensor_factory
    src = np.arange(25, dtype=np.float32)
    buf = mm.allocate(src.nbytes)
    await mm.copy_htod(buf, src)
    back = np.empty_like(src)
    await mm.copy_dtoh(back, buf)
    np.testing.assert_array_equal(back, src)
    # Tensors too, and a device-to-device copy ordered after the write it reads.
    t = f.zeros((25,))
    await mm.copy_htod(t, src * 2)
    u = f.empty((25,))
    mm.copy_dtod(u, t)
    np.testing.assert_array_equal(await u.to_host(), src * 2)
    out = np.empty((5, 5), np.float32)
    await mm.copy_dtoh(out, u)
    np.testing.assert_array_equal(out.reshape(-1), src * 2)


async def test_host_transfer_size_checks(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    buf = mm.allocate(16)
    with pytest.raises(accelkit.InvalidArgumentError, match="32"):
        await mm.copy_htod(buf, np.zeros(8, np.float32))
    with pytest.raises(accelkit.InvalidArgumentError, match="32"):
        await mm.copy_dtoh(np.zeros(8, np.float32), buf)
    with pytest.raises(accelkit.InvalidArgumentError):
        await mm.copy_dtoh(np.zeros((4, 4), np.uint8).T, buf)  # not C-contiguous
    with pytest.raises(accelkit.InvalidArgumentError, match="32"):
        mm.copy_dtod(buf, mm.allocate(32))


async def test_free_while_work_is_queued_is_stream_ordered(backend: ComputeBackend) -> None:
    """free() returns the block after the queued work that reads it, so a new tensor cannot
    overwrite the input of a matmul that has not run yet."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    x = f.full((256, 256), 0.5)
    y = ops.matmul(x, x)  # large: queued on the worker
    mm.free(x)
    z = f.full((256, 256), 7.0)  # same size class; must not be x's block while y is pending
    np.testing.assert_array_equal(await y.to_host(), np.full((256, 256), 64.0, np.float32))
    np.testing.assert_array_equal(await z.to_host(), np.full((256, 256), 7.0, np.float32))
    del z
    assert _info(backend).used == y.nbytes


async def test_used_is_zero_after_shutdown_with_live_tensors() -> None:
    async with accelkit.open_backend("cpu") as b:
        f, ops = b.tensor_factory, b.tensor_ops
        tensors = [f.ones((100, 100)), ops.matmul(f.ones((300, 300)), f.ones((300, 300)))]
        bufs = [b.memory_manager.allocate(n) for n in (10, 1000)]
        mm = b.memory_manager
        assert mm.memory_info().used > 0
    info = mm.memory_info()
    assert (info.used, info.reserved, info.active_allocations, info.peak) == (0, 0, 0, 0)
    assert not any(t.is_alive for t in tensors)
    assert not any(x.is_alive for x in bufs)
    # Dropping the stale tensors afterwards does not disturb the counters.
    del tensors, bufs
    gc.collect()
    assert mm.memory_info().used == 0


async def test_garbage_collected_cycles_are_released(backend: ComputeBackend) -> None:
    """A tensor kept alive only by a reference cycle is released when the collector runs
    (DeviceBuffer.__del__ may run on any thread, even inside the pool)."""
    f = backend.tensor_factory

    class Node:
        self: Node
        t: Tensor

    for _ in range(20):
        n = Node()
        n.self = n
        n.t = f.ones((1000,))
    del n
    gc.collect()
    assert _info(backend).used == 0


def test_the_pool_replaces_a_cached_handle_whose_allocation_failed() -> None:
    """A backend whose allocations complete later (CUDA's queued ``cudaMalloc``) finds one
    failed after its handle was cached: with ``is_failed`` the pool frees it and hands out a
    fresh handle in its place, with no error, from the cache and from a buffer that died since
    the last allocation alike, and the accounting holds one block."""
    from accelkit._core.pool import CachingPool
    from accelkit.device import Device

    freed: list[list[int]] = []
    pool = CachingPool(
        Device("cpu", 0),
        lambda size: [size],  # a handle: a mutable box, [0] once its allocation failed
        freed.append,
        1 << 20,
        is_live=lambda h: h[0] != 0,
        is_failed=lambda h: h[0] == 0,
    )
    buf = pool.allocate(100)
    failed = buf.handle
    pool.free(buf)
    failed[0] = 0  # its allocation failed after it was cached
    fresh = pool.allocate(100)
    assert fresh.handle is not failed
    assert fresh.handle[0] == 128
    assert freed == [failed]
    dying = fresh.handle
    del fresh  # into the released queue, taken straight back by the next allocation
    dying[0] = 0
    again = pool.allocate(100)
    assert again.handle is not dying
    assert again.handle[0] == 128
    assert freed == [failed, dying]
    info = pool.info()
    assert info.used == 100  # (the request; the block is 128)
    assert info.active_allocations == 1
    assert info.reserved == 128


def test_the_pool_never_hands_out_a_handle_it_is_told_is_dead() -> None:
    """The pool's guard (issue 27): a cached handle found dead is dropped with an internal
    error, from the cache and from a buffer that died since the last allocation alike."""
    from accelkit._core.pool import CachingPool
    from accelkit.device import Device
    from accelkit.errors import DeviceError

    freed: list[list[int]] = []
    pool = CachingPool(
        Device("cpu", 0),
        lambda size: [size],  # a handle: a mutable box, [0] once its memory is gone
        freed.append,
        1 << 20,
        is_live=lambda h: h[0] != 0,
    )
    buf = pool.allocate(100)
    handle = buf.handle
    pool.free(buf)
    handle[0] = 0  # freed behind the pool's back
    with pytest.raises(DeviceError, match="internal error"):
        pool.allocate(100)
    fresh = pool.allocate(100)
    assert fresh.handle is not handle
    assert fresh.handle[0] == 128
    dying = fresh.handle
    del fresh  # into the released queue, taken straight back by the next allocation
    dying[0] = 0
    with pytest.raises(DeviceError, match="internal error"):
        pool.allocate(100)
    info = pool.info()
    assert info.used == 0
    assert info.active_allocations == 0
    assert info.reserved == 0  # both dead blocks are out of the accounting


def test_a_buffer_that_died_is_swapped_in_only_within_the_limit() -> None:
    """The allocation's shortcut (the one buffer that died since the last allocation, of the
    same size class, handed straight back) keeps the general path's accounting: the peak
    follows the larger request, and a swap that would pass the limit raises OutOfMemoryError
    with the dead buffer's block cached, not lost or counted twice."""
    from accelkit._core.pool import CachingPool
    from accelkit.device import Device
    from accelkit.errors import OutOfMemoryError

    freed: list[list[int]] = []
    pool = CachingPool(Device("cpu", 0), lambda size: [size], freed.append, 1000)
    assert size_class(600) == size_class(620)
    other = pool.allocate(390)
    x = pool.allocate(600)
    block = x.handle
    del x
    y = pool.allocate(580)  # the same class: swapped in
    assert y.handle is block
    assert (pool.info().used, pool.info().active_allocations) == (970, 2)
    del y
    z = pool.allocate(600)
    assert z.handle is block
    assert pool.info().peak == 990
    del z
    with pytest.raises(OutOfMemoryError):
        pool.allocate(620)  # 390 + 620 > 1000
    info = pool.info()
    assert (info.used, info.active_allocations) == (390, 1)
    # The dead buffer's block is cached (still reserved, not freed), not lost:
    assert info.reserved == size_class(390) + size_class(600)
    assert freed == []
    w = pool.allocate(600)
    assert w.handle is block  # from the cache
    assert pool.info().reserved == size_class(390) + size_class(600)
    del other, w


async def test_free_waits_for_every_stream_that_may_read_the_block(
    backend: ComputeBackend,
) -> None:
    """A tensor read by work queued on another stream, freed on this one: its block must not
    go to a new tensor before that work has run (it went after this stream's work only, and
    the other stream's add read the new tensor's values). This stream's later work is not held
    back meanwhile."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    n = 1 << 16
    x = f.from_host(np.ones(n, np.float32))
    other: Any = backend.create_stream()
    gate = threading.Event()
    other.submit(lambda: gate.wait(10), True)  # the other stream busy until the gate opens
    with backend.use_stream(other):
        y = ops.add(x, 0.0)  # reads x, queued behind the gate
    mm.free(x)
    z = f.from_host(np.full(n, 5, np.float32))  # x's size class: x's block, were it returned
    with anyio.fail_after(10):
        np.testing.assert_array_equal(await z.to_host(), np.full(n, 5, np.float32))
    assert z.buffer.handle is not x.buffer.handle
    gate.set()
    np.testing.assert_array_equal(await y.to_host(), np.ones(n, np.float32))
    await backend.synchronize()
    w = f.from_host(np.full(n, 3, np.float32))  # every stream passed: x's block is back
    assert w.buffer.handle is x.buffer.handle


async def test_after_shutdown_a_dying_tensor_takes_its_block_with_it() -> None:
    """Kept errors (for their awaits) hold no kernel frames, and a tensor that dies after its
    backend's shutdown leaves nothing in the closed pool, which nobody drains again: before,
    an unawaited failed kernel's traceback kept its inputs, and their blocks ended in the
    pool's queue of released buffers for as long as the backend object lived."""
    b = accelkit.create_backend("cpu")
    await b.initialize()
    f, ops = b.tensor_factory, b.tensor_ops
    weight = f.ones((1024, 256))
    bad = ops.embedding(f.from_host(np.array([0, 5000])), weight)  # never awaited
    pool = cast(Any, b).pool
    stream: Any = b.default_stream
    await b.shutdown()
    del bad
    kept = [entry[1] for entry in stream._errors]
    assert kept  # the error stays for an await of its position
    assert all(exc.__traceback__ is None for exc in kept)
    del weight
    gc.collect()
    assert len(pool._released) == 0


async def test_a_free_while_to_host_waits_for_the_writer_makes_it_stale(
    backend: ComputeBackend,
) -> None:
    """to_host waits for a slow writer; the tensor is freed meanwhile and a new tensor takes
    its block: the read raises StaleHandleError (it returned the new tensor's data)."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    j = f.full((512, 512), 1.0 / 512)
    x = j
    for _ in range(8):
        x = ops.matmul(x, j)
    outcome: list[BaseException | None] = []

    async def read() -> None:
        try:
            await x.to_host()
            outcome.append(None)
        except StaleHandleError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.sleep(0.005)
        mm.free(x)
        await backend.synchronize()
        _other = f.full((512, 512), 7.0)
    assert isinstance(outcome[0], StaleHandleError), outcome


async def test_a_failure_named_in_a_note_holds_no_memory(backend: ComputeBackend) -> None:
    """A failed op's error kept for another await (named in a note of the error an await
    raised) held the failed kernel's frames, and with them its 32 MiB tensors, after the
    program had dropped them."""
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    small = f.from_host(np.arange(6, dtype=np.float32).reshape(2, 3))
    upd = f.from_host(np.array([9.0], np.float32))
    n = 8 << 20
    big = f.zeros((n, 1))
    await backend.synchronize()
    gc.collect()
    baseline = mm.memory_info().used - big.nbytes
    a_bad = ops.scatter_nd(small, f.from_host(np.array([[0, 7]])), upd)  # fails first
    b_bad = ops.scatter_nd(
        big, f.from_host(np.array([[n + 5]])), f.from_host(np.array([[9.0]], np.float32))
    )
    with pytest.raises(accelkit.InvalidArgumentError):
        await ops.add(small, 1.0).to_host()  # raises a_bad's failure, names b_bad's
    del a_bad, b_bad, big
    gc.collect()
    assert mm.memory_info().used - baseline < 1 << 20


def test_an_allocation_over_the_limit_waits_for_queued_work_only_where_it_could_fit() -> None:
    """The pool asks its backend (``on_limit``: wait for the streams' queued work, which holds
    dropped tensors) once before it refuses an allocation over the limit, and tries again;
    not for a request larger than the whole limit, which no wait could make fit (it blocked
    the event loop until the queued work had finished, then raised anyway)."""
    from accelkit._core.pool import CachingPool
    from accelkit.device import Device
    from accelkit.errors import OutOfMemoryError

    pool = CachingPool(Device("cpu", 0), lambda size: [size], lambda _h: None, 1000)
    held = [pool.allocate(600)]
    calls: list[int] = []

    def on_limit() -> None:
        calls.append(1)
        held.clear()  # the queued work completed: its buffers die

    pool.on_limit = on_limit
    buf = pool.allocate(600)  # over the limit: waits once, then fits
    assert (calls, pool.info().used) == ([1], 600)
    with pytest.raises(OutOfMemoryError):
        pool.allocate(500)  # waits once, still over: refused
    assert calls == [1, 1]
    with pytest.raises(OutOfMemoryError):
        pool.allocate(1001)  # more than the limit: refused at once
    assert calls == [1, 1]
    del buf
