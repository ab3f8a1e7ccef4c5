"""The CUDA backend's memory manager: device blocks from a caching pool, pinned host transfers.

Blocks are ```cudaMalloc`` allocations (:class:`Block`, wrapped for CuPy as unowned memory) handed out by the core's
:class:`~accelkit._core.pool.CachingPool`, which keeps the exact statistics, the limit and
``trim()``. A freed block is reused at once by later work on the same stream (stream order makes
that safe). With more than one stream, submissions keep their tensors alive until an event after
them has completed, and an explicit ``free`` returns the block once the other streams have passed
the point where it was freed, so no stream is handed a block another is still using.

Host transfers are real asynchronous copies through pinned (page-locked) staging memory from
CuPy's pinned pool: ``cudaMemcpyAsync`` on the stream, awaited through an event without
blocking the loop. The staging block stays alive until the copy completes, even if the awaiting
task is cancelled.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import (
    CachingPool,
    DeviceBuffer,
    PooledMemoryManager,
    buffer_of,
    check_tensor,
    last_writer,
    mark_written,
)
from accelkit.sdk.host import copy_into
from accelkit.tensor import Tensor
from accelkit_cuda.errors import translate
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream, wait_event, wait_event_blocking
from accelkit_cuda.submit import depend

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["Block", "CUDAMemoryManager", "Context", "memptr", "pinned_empty"]

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2
_D2D = 3


class Context:
    """A backend's CUDA context generation, shared with its blocks (bumped by a rebuild)."""

    __slots__ = ("device_id", "generation")

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.generation = 1


class Block:
    """One ``cudaMalloc`` allocation. It frees itself when released by the pool or when its last
    reference goes (a tensor that outlived the backend's shutdown), but only in the context
    generation it was made in: after a rebuild its pointer is dead, and the same value may name
    a new allocation."""

    __slots__ = ("context", "generation", "ptr", "size")

    def __init__(self, ptr: int, size: int, context: Context) -> None:
        self.ptr = ptr
        self.size = size
        self.context = context
        self.generation = context.generation

    def release(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr and self.generation == self.context.generation:
            with contextlib.suppress(Exception), cupy.cuda.Device(self.context.device_id):
                cupy.cuda.runtime.free(ptr)

    def __del__(self) -> None:
        self.release()


def _malloc(size: int) -> int:
    try:
        return int(cupy.cuda.runtime.malloc(size))
    except CUDA_ERRORS as exc:
        if getattr(exc, "status", None) == 2 or "memory" in str(exc).lower():
            raise MemoryError(str(exc)) from None
        raise


def _raw_alloc(backend: CUDABackend) -> Any:
    def alloc(size: int) -> Block:
        with backend._cp_device:
            try:
                ptr = _malloc(size)
            except MemoryError:
                # CuPy's own pool (temporaries of its kernels) may hold the memory: return its
                # free blocks to the driver and try once more.
                cupy.get_default_memory_pool().free_all_blocks()
                ptr = _malloc(size)
        return Block(ptr, size, backend._context)

    return alloc


def _raw_free(block: Block) -> None:
    block.release()


def memptr(block: Block, device_id: int) -> Any:
    """A CuPy memory pointer to a pooled block (CuPy never frees it: the pool does)."""
    return cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(block.ptr, block.size, block, device_id), 0
    )


def pinned_empty(nbytes: int) -> tuple[Any, np.ndarray[Any, Any]]:
    """A pinned host block of ``nbytes`` and a uint8 NumPy view of it."""
    block = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
    return block, np.frombuffer(block, np.uint8, nbytes)


class CUDAMemoryManager(PooledMemoryManager):
    def __init__(
        self, backend: CUDABackend, device: Device, total_bytes: int, config: MemoryPoolConfig
    ) -> None:
        super().__init__(
            backend,
            CachingPool(device, _raw_alloc(backend), _raw_free, total_bytes, config),
        )
        self._backend: CUDABackend = backend

    def _settle(self) -> None:
        self._backend._prune_streams()

    def _current(self) -> CUDAStream:
        return self._backend.current_stream  # type: ignore[return-value]

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        buf = self.owned_buffer(buffer, "buffer")
        streams = self._backend._streams
        if len(streams) < 2:
            self.pool.free(buf)  # one stream: every later use is in order after this point
            return
        # Returned once every stream has passed this point: work queued so far on any of them
        # may still use the block, and the pool may hand it to any stream next.
        events = [s.event_now() for s in streams]
        self.pool.free(buf, lambda recycle: self._backend._after_events(events, recycle))

    def _copy(self, stream: CUDAStream, dst: int, src: int, nbytes: int, kind: int) -> None:
        backend = self._backend
        backend._check_usable()
        try:
            with backend._cp_device:
                cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.cp.ptr)
        except CUDA_ERRORS as exc:
            raise backend._failed(translate(exc, "a copy")) from None

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self._host_source(dst, src)
        if view.nbytes == 0:
            return
        block, staging = pinned_empty(view.nbytes)
        staging[...] = np.frombuffer(view, np.uint8)  # the caller may reuse src at once
        stream = self._current()
        with self._backend._cp_device, stream.cp:
            depend(stream, [dst])
        self._copy(stream, buf.handle.ptr, staging.ctypes.data, view.nbytes, _H2D)
        seq = stream.record()
        event = stream.hold((block, buf))
        if isinstance(dst, Tensor):
            mark_written((dst,), stream, seq)
        await wait_event(event, "copy_htod", self._backend._failed)

    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        buf = self._host_destination(dst, src)
        if dst.nbytes == 0:
            return
        stream = self._current()
        with self._backend._cp_device, stream.cp:
            depend(stream, [src])
        block, staging = pinned_empty(dst.nbytes)
        self._copy(stream, staging.ctypes.data, buf.handle.ptr, dst.nbytes, _D2H)
        stream.record()
        event = stream.hold((block, buf))
        await wait_event(event, "copy_dtoh", self._backend._failed)
        dst.reshape(-1).view(np.uint8)[...] = staging

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self._device_pair(dst, src)
        if s.nbytes == 0:
            return
        stream = self._current()
        with self._backend._cp_device, stream.cp:
            depend(stream, [t for t in (src, dst) if isinstance(t, Tensor)])
        self._copy(stream, d.handle.ptr, s.handle.ptr, s.nbytes, _D2D)
        seq = stream.record((d, s) if stream.track else ())
        if isinstance(dst, Tensor):
            mark_written((dst,), stream, seq)

    # -- tensor transfers -------------------------------------------------------------------------
    def _read(self, tensor: Tensor) -> tuple[np.ndarray[Any, Any], Any, CUDAStream]:
        check_tensor(self._backend, tensor, "tensor")
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        stream: CUDAStream = last_writer(tensor)[0]  # type: ignore[assignment]
        if out.nbytes == 0:
            return out, None, stream
        # On the writer's stream: in order after the writer, with no cross-stream dependency.
        block, staging = pinned_empty(out.nbytes)
        self._copy(stream, staging.ctypes.data, buffer_of(tensor).handle.ptr, out.nbytes, _D2H)
        stream.record()
        event = stream.hold((block, buffer_of(tensor)))
        return staging, event, stream

    def _finish(self, tensor: Tensor, staging: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        out.reshape(-1).view(np.uint8)[...] = staging
        return out

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        staging, event, stream = self._read(tensor)
        if event is None:
            return staging
        await wait_event(event, "reading a tensor", self._backend._failed)
        stream.raise_errors(last_writer(tensor)[1])
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        # Out of the pinned staging block, off the event loop when large (sdk.host).
        await copy_into(out.reshape(-1).view(np.uint8), staging)
        return out

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        staging, event, stream = self._read(tensor)
        if event is None:
            return staging
        wait_event_blocking(event, "reading a tensor", self._backend._failed)
        stream.raise_errors(last_writer(tensor)[1])
        return self._finish(tensor, staging)
