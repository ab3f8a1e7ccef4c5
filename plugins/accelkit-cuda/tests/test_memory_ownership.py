"""Who frees a block of device memory, without a GPU: a stand-in for CuPy's runtime records every
``cudaMalloc``/``cudaFree`` and drives the real :class:`~accelkit_cuda.memory.CUDAMemoryKernels`
and its :class:`~accelkit._core.pool.CachingPool`.

The bug these tests pin down (docs/backends/cuda.md, "Memory"): a buffer that died inside a
reference cycle was put back into the pool by ``DeviceBuffer.__del__`` while the same garbage
collection ran ``Block.__del__``, which freed the block; the pool then handed out address 0.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

cupy = pytest.importorskip("cupy")
from accelkit_cuda import memory  # noqa: E402
from accelkit_cuda.backend import CUDABackend  # noqa: E402

from accelkit.device import Device  # noqa: E402
from accelkit.dtype import DType  # noqa: E402
from accelkit.errors import DeviceError  # noqa: E402
from accelkit.memory import MemoryPoolConfig  # noqa: E402
from accelkit.sdk import HostStream, Opened  # noqa: E402

GIB = 1 << 30


class Runtime:
    """``cupy.cuda.runtime.malloc``/``free``, recorded: pointers from a counter, never reused
    (so a freed address can be told from a live one)."""

    def __init__(self) -> None:
        self.next = 0x7F00_0000_0000
        self.live: set[int] = set()
        self.freed: list[int] = []
        self.free_outside_the_pool: list[int] = []
        self.pool: Any = None
        self.memory: Any = None

    def malloc(self, size: int) -> int:
        ptr, self.next = self.next, self.next + max(size, 1) + 4096
        self.live.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return  # cudaFree(0) is a no-op (CuPy's context probe)
        assert ptr in self.live, f"cudaFree({ptr:#x}) of memory that is not allocated"
        # The one owner: the pool, under its lock, or the backend's teardown (after the pool
        # was released: DeviceMemory.release_all), never a garbage collector.
        if (
            self.pool is not None
            and not self.pool._lock.locked()
            and not self.memory.blocks.torn_down
        ):
            self.free_outside_the_pool.append(ptr)
        self.live.remove(ptr)
        self.freed.append(ptr)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Runtime:
    rt = Runtime()
    monkeypatch.setattr(cupy.cuda.runtime, "malloc", rt.malloc)
    monkeypatch.setattr(cupy.cuda.runtime, "free", rt.free)
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a: contextlib.nullcontext())
    return rt


class StandInBackend(CUDABackend):
    """The CUDA backend with a real memory manager over the stand-in runtime, and no submission
    thread: DeviceMemory runs its CUDA calls in place (under the pool's lock). Its one stream
    is a host stream (no kernel runs here)."""

    def _device_count(self) -> int:
        return 1

    async def _initialize(self, device: Device) -> Opened[Any]:
        from accelkit_cuda.factory_kernels import CUDAFactoryKernels
        from accelkit_cuda.tensor_kernels import CUDATensorKernels

        self._cp_device = contextlib.nullcontext()
        self._device_obj = device
        self.device_index = device.index
        mm = self._memory = memory.CUDAMemoryKernels(self, device, 8 * GIB, MemoryPoolConfig())
        return Opened(
            streams=[QuietStream(device, f"{device}/default")],
            memory=mm,
            tensor=CUDATensorKernels(self),
            factory=CUDAFactoryKernels(self),
            dtypes=frozenset({DType.F32}),
        )


class QuietStream(HostStream):
    """A host stream that a poisoned backend's teardown can abandon (as it does CUDA streams)."""

    def abandon(self) -> None:
        pass


@pytest.fixture
def backend(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> Iterator[CUDABackend]:
    """A CUDA backend whose memory manager is real and whose device is the stand-in."""
    from accelkit_cuda import backend as backend_module

    # A poisoning here must not mark the real cuda:0 of this process (tests/test_gpu.py).
    monkeypatch.setattr(backend_module, "_POISONED_DEVICES", {}, raising=False)
    monkeypatch.setattr(backend_module, "_LEFT_TO_THE_PROCESS", [], raising=False)
    b = StandInBackend()
    anyio.run(b.initialize, "cuda:0")
    runtime.pool = b.pool
    runtime.memory = b.memory_manager.kernels
    yield b
    runtime.pool = runtime.memory = None


def _park_in_a_cycle(backend: CUDABackend, nbytes: int) -> int:
    """Allocate a buffer and drop it inside an exception reference cycle (frame <-> traceback),
    as any function that caught an error after allocating does; returns its address."""
    buf = backend.memory_manager.allocate(nbytes)
    ptr = int(buf.handle.ptr)
    try:
        raise ValueError("refused")
    except ValueError as exc:
        err = exc  # err -> __traceback__ -> this frame -> err and buf: a cycle
    assert err is not None
    return ptr


def test_a_buffer_that_dies_in_a_cycle_is_reused_live(
    backend: CUDABackend, runtime: Runtime
) -> None:
    mm = backend.memory_manager
    old = _park_in_a_cycle(backend, 8)
    gc.collect()  # one pass finalizes the buffer (back to the pool) and its block together
    again = mm.allocate(8)
    ptr = int(again.handle.ptr)
    assert ptr != 0, "the pool handed out a freed block (address 0)"
    assert ptr in runtime.live, f"the pool handed out {ptr:#x}, which was freed"
    assert ptr == old  # the same 64 B block, taken back from the pool
    assert runtime.freed == []
    assert mm.memory_info().active_allocations == 1


def test_no_block_is_freed_by_the_garbage_collector(backend: CUDABackend, runtime: Runtime) -> None:
    """Whatever the order objects die in (cycles, plain drops, the pool's cache dropped with
    the buffers), device memory is freed only by the pool or by the backend's teardown."""
    mm = backend.memory_manager
    for n in (8, 100, 5000, 1 << 20):
        _park_in_a_cycle(backend, n)
    bufs = [mm.allocate(n) for n in (64, 64, 300)]
    del bufs
    gc.collect()
    assert runtime.freed == []
    assert mm.trim() > 0  # the pool's own release: under its lock
    assert runtime.free_outside_the_pool == []
    assert runtime.freed
    assert not runtime.live


def test_the_pool_refuses_to_hand_out_a_dead_block(backend: CUDABackend) -> None:
    mm = backend.memory_manager
    buf = mm.allocate(8)
    block = buf.handle
    mm.free(buf)  # one stream: back to the cache at once
    block.ptr = 0  # as a block freed behind the pool's back would be
    with pytest.raises(DeviceError, match=r"internal error.*freed"):
        mm.allocate(8)
    # The dead block is dropped, not cached again: the next allocation is a fresh, live one.
    assert mm.allocate(8).handle.ptr != 0


@pytest.mark.anyio
async def test_shutdown_frees_every_block_once(backend: CUDABackend, runtime: Runtime) -> None:
    mm = backend.memory_manager
    kept = mm.allocate(1000)  # a tensor's buffer that outlives the backend
    mm.free(mm.allocate(100))  # cached
    _park_in_a_cycle(backend, 8)
    gc.collect()
    await backend.shutdown()
    assert runtime.live == set(), [hex(p) for p in runtime.live]
    assert len(runtime.freed) == len(set(runtime.freed)) == 3
    assert runtime.free_outside_the_pool == []
    assert not kept.is_alive
    del kept
    gc.collect()  # its death after shutdown frees nothing again
    assert len(runtime.freed) == 3


@pytest.mark.anyio
async def test_a_poisoned_backend_leaves_its_blocks_to_the_process(
    backend: CUDABackend, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """cudaFree on a context with a sticky error fails: the blocks are left (the process must
    exit anyway), with a log line, and no CUDA call is made."""
    from accelkit.errors import ContextPoisonedError

    mm = backend.memory_manager
    kept = mm.allocate(1000)
    mm.free(mm.allocate(100))
    backend._failed(ContextPoisonedError("a kernel: cudaErrorIllegalAddress (700)"))
    with caplog.at_level("WARNING", logger="accelkit.cuda"):
        await backend.shutdown()
    assert runtime.freed == []
    assert "2 blocks" in caplog.text
    assert "poisoned" in caplog.text
    del kept


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's collector")
def test_the_evidence_script_stand_in_shape(backend: CUDABackend, runtime: Runtime) -> None:
    """The shape of dead-block-stand-in.py, with the real classes: the resurrected buffer's
    block is still allocated."""
    mm = backend.memory_manager
    pool = mm.pool

    def example() -> None:
        buf = mm.allocate(0)
        try:
            raise ValueError
        except ValueError as e:
            err = e
        assert err is not None
        assert buf is not None

    example()
    gc.collect()
    assert len(pool._released) == 1
    handle = pool._released[0].handle
    assert handle.ptr in runtime.live


def test_a_cupy_array_over_a_block_keeps_its_buffer(backend: CUDABackend) -> None:
    """CuPy arrays made over a pooled block (a tensor's storage, a kernel argument) hold the
    buffer, so the pool cannot hand the block to other work while one of them exists."""
    import weakref

    from accelkit_cuda.submit import device_array

    from accelkit.dtype import DType

    mm = backend.memory_manager
    buf = mm.allocate(64)
    ptr = buf.handle.ptr
    arr = device_array(buf, 0, (4, 4), DType.F32)
    assert arr.data.ptr == ptr
    alive = weakref.ref(buf)
    del buf
    gc.collect()
    assert alive() is not None
    other = mm.allocate(64)
    assert other.handle.ptr != ptr  # not recycled while the array exists
    del arr
    gc.collect()
    assert mm.allocate(64).handle.ptr == ptr  # back in the pool now
    assert alive() is None
