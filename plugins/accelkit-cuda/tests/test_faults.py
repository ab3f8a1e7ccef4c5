"""A sticky CUDA fault poisons the backend for good, by fault injection without a GPU.

A stand-in device replaces CuPy's runtime (``malloc``, ``free``, ``memcpyAsync``), its streams
and events and its pinned allocator; once a fault is injected, every call raises CuPy's own
``CUDARuntimeError`` with that status code, as a real context does after a sticky error. The
backend above it is the real one (memory manager, pool, components, streams): every later
call on every component must raise ``ContextPoisonedError`` naming the first fault, ``status``
must say so, and ``shutdown`` must return without a CUDA call.

Every CUDA call runs on the backend's submission thread (or a stream's completer thread), so a
fault is found there and surfaces at the next await that covers the failed work; from then on
every call refuses at once, before anything is queued.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
from accelkit_cuda import backend as backend_module  # noqa: E402
from accelkit_cuda.backend import CUDABackend  # noqa: E402
from accelkit_cuda.driver import Attr, DeviceProps  # noqa: E402
from accelkit_cuda.errors import STICKY_ERRORS  # noqa: E402

import accelkit as ak  # noqa: E402
from accelkit.capabilities import LifecycleState  # noqa: E402
from accelkit.errors import (  # noqa: E402
    ContextPoisonedError,
    KernelCompileError,
    OutOfMemoryError,
)
from accelkit.sdk import KernelHandle  # noqa: E402

pytestmark = pytest.mark.anyio

GIB = 1 << 30
CudaError = cupy.cuda.runtime.CUDARuntimeError


class StandInGPU:
    """CuPy's runtime, streams and events over no device; ``fault`` makes every call fail."""

    def __init__(self) -> None:
        self.fault: int | None = None
        self.fail_next: dict[str, int] = {}  # call name -> status of its next call only
        self.calls: list[str] = []
        self.malloc_fails: int | None = None  # every cudaMalloc fails with this (not sticky)
        self.busy = False  # events recorded while busy stay pending until it is cleared
        self.pool_emptied = 0
        self.live: set[int] = set()
        self._ptrs = itertools.count(0x7F00_0000_0000, 1 << 20)

    def call(self, name: str) -> None:
        self.calls.append(name)
        code = self.fail_next.pop(name, None) or self.fault
        if code is not None:
            raise CudaError(code)

    def malloc(self, size: int) -> int:
        self.call("malloc")
        if self.malloc_fails is not None:
            raise CudaError(self.malloc_fails)
        ptr = next(self._ptrs)
        self.live.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        self.call("free")
        self.live.discard(ptr)

    def memcpy_async(self, *args: Any) -> None:
        self.call("memcpyAsync")


def _stand_ins(gpu: StandInGPU) -> tuple[type, type]:
    class Stream:
        def __init__(self, non_blocking: bool = False) -> None:
            gpu.call("streamCreate")
            self.ptr = 0x5000

        @property
        def done(self) -> bool:
            gpu.call("streamQuery")
            return True

        def synchronize(self) -> None:
            gpu.call("streamSynchronize")

        def wait_event(self, event: Any) -> None:
            gpu.call("streamWaitEvent")

        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    class Event:
        def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
            gpu.call("eventCreate")
            self.recorded_busy = False

        def record(self, stream: Any = None) -> None:
            gpu.call("eventRecord")
            self.recorded_busy = gpu.busy

        @property
        def done(self) -> bool:
            gpu.call("eventQuery")
            return not (self.recorded_busy and gpu.busy)

        def synchronize(self) -> None:
            gpu.call("eventSynchronize")

    return Stream, Event


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> StandInGPU:
    g = StandInGPU()
    stream, event = _stand_ins(g)
    monkeypatch.setattr(cupy.cuda.runtime, "malloc", g.malloc)
    monkeypatch.setattr(cupy.cuda.runtime, "free", g.free)
    monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", g.memcpy_async)
    monkeypatch.setattr(cupy.cuda, "Stream", stream)
    monkeypatch.setattr(cupy.cuda, "Event", event)
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(cupy.cuda, "alloc_pinned_memory", lambda n: bytearray(n))

    class CuPyPool:  # CuPy's own pool, for its kernels' temporaries
        def free_all_blocks(self) -> None:
            g.pool_emptied += 1

    monkeypatch.setattr(cupy, "get_default_memory_pool", CuPyPool)
    # Process-wide records of poisoned devices: this test's own.
    monkeypatch.setattr(backend_module, "_POISONED_DEVICES", {})
    monkeypatch.setattr(backend_module, "_LEFT_TO_THE_PROCESS", [])
    return g


PROPS = DeviceProps(
    0, "Stand-in GPU", 80 * GIB,
    {Attr.COMPUTE_CAPABILITY_MAJOR: 9, Attr.COMPUTE_CAPABILITY_MINOR: 0,
     Attr.MULTIPROCESSOR_COUNT: 132, Attr.MAX_THREADS_PER_BLOCK: 1024, Attr.WARP_SIZE: 32},
    12040,
)  # fmt: skip


@pytest.fixture
async def backend(gpu: StandInGPU, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CUDABackend]:
    """The real backend on the stand-in device, opened by ``initialize`` (the driver's device
    list, the NVRTC compile of the fused program and the warm-up of CuPy's kernels left out)."""
    from accelkit_cuda import nvrtc

    def no_nvrtc(*args: Any, **kwargs: Any) -> Any:
        raise KernelCompileError("no NVRTC on the stand-in device")

    monkeypatch.setattr(backend_module, "_devices", lambda: [PROPS])
    monkeypatch.setattr(backend_module, "cupy_status", lambda: None)
    monkeypatch.setattr(backend_module, "_warm_up", lambda draws=True: None)
    monkeypatch.setattr(nvrtc, "compile_cached", no_nvrtc)  # fused ops run as compositions
    b = CUDABackend()
    await b.initialize("cuda:0")
    assert b.capabilities.device == "cuda:0"
    yield b
    await b.shutdown()


FAULTS = [
    ("memcpyAsync", 700),  # an illegal address, seen at the next copy
    ("eventSynchronize", 719),  # a launch failure, seen when work is awaited
    ("malloc", 716),  # a misaligned address, seen by cudaMalloc
    ("completer", 715),  # an illegal instruction, seen by the completer while nobody awaits
    ("streamWaitEvent", 714),  # a hardware stack error, seen ordering one stream after another
    ("memcpyAsync", 214),  # an uncorrectable ECC error
    ("eventRecord", 999),  # unknown
]


async def _trigger(backend: CUDABackend, call: str) -> None:
    """Public calls that queue work reaching the stand-in's ``call``, then the await that covers
    it (the fault is found on the submission or completer thread, and raised there)."""
    f, mm = backend.tensor_factory, backend.memory_manager
    if call == "malloc":
        await f.from_host(np.zeros(1 << 20, np.float32)).to_host()  # a fresh block
    elif call == "memcpyAsync":
        await f.from_host(np.ones(3, np.float32)).to_host()
    elif call in ("eventSynchronize", "eventRecord"):
        buf = mm.allocate(64)
        mm.copy_dtod(buf, buf)
        await backend.synchronize()
    elif call == "completer":
        # Nobody awaits the work: the fault still poisons the backend, and the next call
        # (here a statistics query) refuses at once.
        buf = mm.allocate(64)
        mm.copy_dtod(buf, buf)
        await backend._thread.call(lambda: None)  # the queued copy has run there
        assert backend.poisoned
        mm.memory_info()
    elif call == "streamWaitEvent":
        other = backend.create_stream()
        other.wait_event(backend.default_stream.record_event())
        await other.synchronize()


async def _hit_the_fault(backend: CUDABackend, gpu: StandInGPU, call: str, code: int) -> Any:
    """Make the fault happen in ``call``, through the public API; returns a tensor made before."""
    f = backend.tensor_factory
    x = f.from_host(np.arange(6, dtype=np.float32))
    await backend.synchronize()  # what was queued before (its mallocs, copies) has run
    gpu.fail_next[call] = code
    gpu.fault = code  # sticky: every call from now on fails as the real context would
    with pytest.raises(ContextPoisonedError) as info:
        await _trigger(backend, call)
    assert STICKY_ERRORS[code] in str(info.value)
    assert not isinstance(info.value, OutOfMemoryError)
    return x


@pytest.mark.parametrize(("call", "code"), FAULTS, ids=[f"{c}-{n}" for c, n in FAULTS])
async def test_every_component_refuses_after_a_sticky_fault(
    backend: CUDABackend, gpu: StandInGPU, call: str, code: int
) -> None:
    ops, f, mm = backend.tensor_ops, backend.tensor_factory, backend.memory_manager
    ex, kops = backend.kernel_executor, backend.kernel_ops
    assert ex is not None
    stream = backend.default_stream
    before = stream.record_event()
    other = backend.create_stream()
    buf = mm.allocate(64)
    x = await _hit_the_fault(backend, gpu, call, code)
    first = STICKY_ERRORS[code]
    assert backend.poisoned
    handle = KernelHandle(
        name="k", language="cuda", key="0", backend="cuda", device="cuda:0", generation=1
    )
    sync_calls: dict[str, Callable[[], Any]] = {
        "ops.add": lambda: ops.add(x, 1.0),
        "ops.reshape": lambda: ops.reshape(x, (2, 3)),
        "ops.matmul": lambda: ops.matmul(ops.reshape(x, (2, 3)), ops.reshape(x, (3, 2))),
        "factory.zeros": lambda: f.zeros((4,), ak.DType.F32),
        "factory.from_host": lambda: f.from_host(np.ones(2)),
        "kernel_ops.silu_mul": lambda: kops.silu_mul(x, x),
        "mm.allocate": lambda: mm.allocate(8),
        "mm.free": lambda: mm.free(buf),
        "mm.memory_info": mm.memory_info,
        "mm.trim": mm.trim,
        "mm.copy_dtod": lambda: mm.copy_dtod(buf, buf),
        "kernels.execute": lambda: ex.execute_kernel(handle, (1,), (1,), [x]),
        "kernels.info": lambda: ex.kernel_info(handle),
        "kernels.unload": lambda: ex.unload_kernel(handle),
        "backend.tensor_ops": lambda: backend.tensor_ops,
        "backend.create_stream": backend.create_stream,
        "backend.default_stream": lambda: backend.default_stream,
        "stream.record_event": stream.record_event,
        "stream.query": stream.query,
        "other.wait_event": lambda: other.wait_event(before),
        "event.query": before.query,
        "x.numpy": x.numpy,
    }
    async_calls: dict[str, Callable[[], Any]] = {
        "synchronize": backend.synchronize,
        "stream.synchronize": stream.synchronize,
        "event.wait": before.wait,
        "x.to_host": x.to_host,
        "mm.copy_htod": lambda: mm.copy_htod(buf, b"12345678"),
        "mm.copy_dtoh": lambda: mm.copy_dtoh(np.empty(8, np.uint8), buf),
        "kernels.load": lambda: ex.load_kernel('extern "C" __global__ void k() {}', "k"),
    }
    gpu.calls.clear()
    for name, call_ in sync_calls.items():
        with pytest.raises(ContextPoisonedError) as info:
            call_()
        _says_poisoned(name, str(info.value), first)
    for name, acall in async_calls.items():
        with pytest.raises(ContextPoisonedError) as info:
            await acall()
        _says_poisoned(name, str(info.value), first)
    assert gpu.calls == []  # refused before any CUDA call: nothing can hang on the device
    status = backend.status
    assert status.error is not None
    _says_poisoned("status", status.error, first)
    assert status.state is LifecycleState.READY


def _says_poisoned(name: str, text: str, first: str) -> None:
    assert first in text, f"{name}: {text}"
    assert "must be restarted" in text, f"{name}: {text}"


async def test_shutdown_returns_and_makes_no_cuda_call(
    backend: CUDABackend, gpu: StandInGPU, caplog: pytest.LogCaptureFixture
) -> None:
    f = backend.tensor_factory
    kept = f.from_host(np.arange(100, dtype=np.float32))
    await _hit_the_fault(backend, gpu, "eventSynchronize", 700)
    gpu.calls.clear()
    with caplog.at_level(logging.WARNING, logger="accelkit.cuda"):
        await backend.shutdown()
    assert gpu.calls == []
    assert backend.memory_manager.memory_info().used == 0
    assert backend.status.state is LifecycleState.SHUT_DOWN
    assert "left to the process" in caplog.text
    assert "cudaErrorIllegalAddress" in caplog.text
    del kept


async def test_a_new_backend_on_a_poisoned_device_refuses_to_open(
    backend: CUDABackend, gpu: StandInGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _hit_the_fault(backend, gpu, "memcpyAsync", 700)
    monkeypatch.setattr(backend_module, "_devices", lambda: [PROPS])
    monkeypatch.setattr(backend_module, "cupy_status", lambda: None)
    fresh = CUDABackend()
    monkeypatch.setattr(fresh, "supports_device", lambda d: True)
    with pytest.raises(ContextPoisonedError, match=r"must be restarted.*cudaErrorIllegalAddress"):
        await fresh.initialize("cuda:0")
    await fresh.shutdown()


async def test_an_illegal_access_in_malloc_is_not_out_of_memory(
    backend: CUDABackend, gpu: StandInGPU
) -> None:
    """The message has "memory" in it; the status code says it is a sticky fault. The
    ``cudaMalloc`` runs on the submission thread: the allocation returns, the fault poisons the
    backend there, and the next call refuses."""
    gpu.fail_next["malloc"] = 700
    buf = backend.memory_manager.allocate(1 << 20)
    await backend._thread.call(lambda: None)  # the queued cudaMalloc has run
    assert backend.poisoned
    assert isinstance(buf.handle.error, ContextPoisonedError)
    with pytest.raises(ContextPoisonedError, match="cudaErrorIllegalAddress"):
        backend.memory_manager.allocate(1 << 20)


async def test_out_of_memory_is_still_out_of_memory(backend: CUDABackend, gpu: StandInGPU) -> None:
    """A full device is found by the ``cudaMalloc`` on the submission thread (after one retry
    with CuPy's cached blocks given back): the allocation returns, and the work that uses the
    block raises OutOfMemoryError at its await; the backend stays usable."""
    mm = backend.memory_manager
    gpu.malloc_fails = 2  # cudaErrorMemoryAllocation
    buf = mm.allocate(1 << 20)
    with pytest.raises(OutOfMemoryError, match="could not be allocated"):
        await mm.copy_htod(buf, bytes(16))
    assert isinstance(buf.handle.error, MemoryError)
    assert gpu.pool_emptied == 1  # CuPy's cached blocks were given back before the retry
    assert not backend.poisoned
    gpu.malloc_fails = None
    fresh = mm.allocate(2 << 20)
    await backend._thread.call(lambda: None)
    assert fresh.handle.ptr in gpu.live


async def test_unload_keeps_the_module_until_queued_launches_pass(
    backend: CUDABackend, gpu: StandInGPU
) -> None:
    """cuModuleUnload (CuPy's, when the module object goes) must not run while launches of
    the kernel are still queued: every stream holds the module until the position queued at
    the unload has completed (then its completer thread drops it, off the loop's thread)."""
    import gc
    import threading
    import weakref

    ex = backend.kernel_executor
    assert ex is not None
    other = backend.create_stream()

    class Module:  # stands for cupy.cuda.function.Module
        pass

    module = Module()
    key = "k:saxpy:1"
    ex._loaded[key] = (module, object(), None, {})  # type: ignore[attr-defined]
    handle = KernelHandle(
        name="saxpy", language="cuda", key="k", backend="cuda", device="cuda:0", generation=1
    )
    gone = weakref.ref(module)
    del module
    gate = threading.Event()

    def stall() -> None:
        gate.wait(30)

    backend._thread.submit(stall)  # launches queued so far have not run yet
    try:
        ex.unload_kernel(handle)
        gc.collect()
        assert gone() is not None  # held by both streams
    finally:
        gate.set()
    await backend.default_stream.synchronize()
    await other.synchronize()
    gc.collect()
    assert gone() is None
