"""The CUDA backend's memory manager: device blocks from a caching pool, pinned host transfers.

Blocks are ``cudaMalloc`` allocations (:class:`Block`, wrapped for CuPy as unowned memory that
keeps its buffer alive) handed out by the core's :class:`~accelkit._core.pool.CachingPool`, which
keeps the exact statistics, the limit and ``trim()``. Their memory has one owner,
:class:`DeviceMemory`: only the pool (under its lock) and the backend's teardown free it, never a
garbage collector. A freed block is reused at once by later work on the same stream (stream order makes
that safe). With more than one stream, submissions keep their tensors alive until an event after
them has completed, and an explicit ``free`` returns the block once the other streams have passed
the point where it was freed, so no stream is handed a block another is still using.

Host transfers are real asynchronous copies through pinned (page-locked) staging memory from
CuPy's pinned pool: ``cudaMemcpyAsync`` on the stream, awaited through an event without
blocking the loop. The staging block stays alive until the copy completes, even if the awaiting
task is cancelled.
"""

from __future__ import annotations

import logging
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
from accelkit_cuda.errors import OUT_OF_MEMORY, error_code, translate
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream, wait_event, wait_event_blocking
from accelkit_cuda.submit import depend

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["Block", "CUDAMemoryManager", "DeviceMemory", "block_is_live", "memptr", "pinned_empty"]

_log = logging.getLogger("accelkit.cuda")

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2
_D2D = 3


class Block:
    """One ``cudaMalloc`` allocation. It never frees itself: its memory has one owner, the
    :class:`DeviceMemory` of its backend, which frees it when the pool lets it go (under the
    pool's lock) or at the backend's teardown. A ``__del__`` that freed it would run in the same
    garbage collection that puts a buffer dying in a reference cycle back into the pool, and the
    pool would then hand out freed memory (the race of issue 27)."""

    __slots__ = ("ptr", "size")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size

    def __repr__(self) -> str:
        return f"Block({self.ptr:#x}, {self.size})"


def block_is_live(block: Block) -> bool:
    """The pool's check before it hands a cached block out again."""
    return block.ptr != 0


def _malloc(size: int) -> int:
    try:
        return int(cupy.cuda.runtime.malloc(size))
    except CUDA_ERRORS as exc:
        # By the status code only: "an illegal memory access was encountered" mentions memory
        # too, and is a sticky fault, not a full device.
        if error_code(exc) == OUT_OF_MEMORY:
            raise MemoryError(str(exc)) from None
        raise


class DeviceMemory:
    """Every block a backend has ``cudaMalloc``-ed and not yet freed: the one owner of its
    device memory. The pool calls :meth:`alloc` and :meth:`free` (its ``raw_alloc`` and
    ``raw_free``) under its lock, at allocation, ``trim`` and statistics calls, on the thread
    that made them, never from a garbage collector; :meth:`release_all` (the backend's teardown,
    after its streams have finished) frees what tensors alive at shutdown still hold. On a
    poisoned context nothing is freed: ``cudaFree`` would fail, and the memory goes with the
    process, which must exit anyway."""

    def __init__(self, backend: CUDABackend) -> None:
        self._backend = backend
        self._live: dict[int, Block] = {}
        #: Blocks (and bytes) not freed because the context was poisoned: logged at teardown.
        self._left = [0, 0]

    def alloc(self, size: int) -> Block:
        backend = self._backend
        try:
            with backend._cp_device:
                try:
                    ptr = _malloc(size)
                except MemoryError:
                    # CuPy's own pool (temporaries of its kernels) may hold the memory: return
                    # its free blocks to the driver (cudaFree waits for the device, so no queued
                    # kernel still uses them) and try once more.
                    cupy.get_default_memory_pool().free_all_blocks()
                    ptr = _malloc(size)
        except CUDA_ERRORS as exc:
            raise backend._failed(translate(exc, f"allocating {size} bytes")) from None
        block = Block(ptr, size)
        self._live[ptr] = block
        return block

    def free(self, block: Block) -> None:
        ptr, block.ptr = block.ptr, 0
        if not ptr or self._live.pop(ptr, None) is None:
            return
        if self._backend._poisoned is not None:
            self._left[0] += 1
            self._left[1] += block.size
            return
        try:
            with self._backend._cp_device:
                cupy.cuda.runtime.free(ptr)
        except CUDA_ERRORS as exc:  # never raised into the pool: noted, and the block left
            error = self._backend._failed(translate(exc, "freeing device memory"))
            _log.warning("%s: a block of %d bytes was not freed: %s", self._backend._device_obj,
                         block.size, error)  # fmt: skip

    def release_all(self) -> None:
        """The backend's teardown: free every block still allocated (held by tensors that
        outlive the backend; they are stale now, so nothing reads the memory again)."""
        for block in list(self._live.values()):
            self.free(block)
        count, nbytes = self._left
        if count:
            _log.warning(
                "%s: %d blocks (%d bytes) of device memory left to the process: the CUDA context"
                " is poisoned (%s), so they cannot be freed; the process must be restarted",
                self._backend._device_obj, count, nbytes, self._backend._poisoned,
            )  # fmt: skip
            self._left = [0, 0]


def memptr(buffer: DeviceBuffer, device_id: int) -> Any:
    """A CuPy memory pointer to a pooled buffer's block. CuPy never frees it (the pool does),
    and every CuPy array over it keeps the *buffer* alive, so the pool cannot hand the block to
    anyone else while such an array exists."""
    block = buffer.handle
    return cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(block.ptr, block.size, buffer, device_id), 0
    )


def pinned_empty(nbytes: int) -> tuple[Any, np.ndarray[Any, Any]]:
    """A pinned host block of ``nbytes`` and a uint8 NumPy view of it."""
    block = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
    return block, np.frombuffer(block, np.uint8, nbytes)


class CUDAMemoryManager(PooledMemoryManager):
    def __init__(
        self, backend: CUDABackend, device: Device, total_bytes: int, config: MemoryPoolConfig
    ) -> None:
        self.blocks = DeviceMemory(backend)
        pool = CachingPool(
            device, self.blocks.alloc, self.blocks.free, total_bytes, config, block_is_live
        )
        super().__init__(backend, pool)
        self._backend: CUDABackend = backend

    def release_blocks(self) -> None:
        """The backend's teardown (after ``pool.invalidate_all``): free what is still held."""
        with self.pool._lock:
            self.blocks.release_all()

    def _settle(self) -> None:
        self._backend._prune_streams()

    def _current(self) -> CUDAStream:
        return self._backend.current_stream  # type: ignore[return-value]

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        self._backend._check_usable()
        buf = self.owned_buffer(buffer, "buffer")
        streams = self._backend._streams
        if len(streams) < 2:
            self.pool.free(buf)  # one stream: every later use is in order after this point
            return
        # Returned once every stream has passed this point: work queued so far on any of them
        # may still use the block, and the pool may hand it to any stream next.
        events = [s.event_now() for s in streams]
        self.pool.free(buf, lambda recycle: self._backend._after_events(events, recycle))

    def _pinned(self, nbytes: int) -> tuple[Any, np.ndarray[Any, Any]]:
        try:
            return pinned_empty(nbytes)
        except CUDA_ERRORS as exc:
            raise self._backend._failed(translate(exc, "pinned staging memory")) from None

    def _depend(self, stream: CUDAStream, inputs: Any) -> None:
        try:
            with self._backend._cp_device, stream.cp:
                depend(stream, inputs)
        except CUDA_ERRORS as exc:
            raise self._backend._failed(translate(exc, "ordering a copy")) from None

    def _copy(self, stream: CUDAStream, dst: int, src: int, nbytes: int, kind: int) -> None:
        backend = self._backend
        backend._check_usable()
        try:
            with backend._cp_device:
                cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.cp.ptr)
        except CUDA_ERRORS as exc:
            raise backend._failed(translate(exc, "a copy")) from None

    def configure_pool(self, config: MemoryPoolConfig) -> None:
        self._backend._check_usable()
        super().configure_pool(config)

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        self._backend._check_usable()
        buf, view = self._host_source(dst, src)
        if view.nbytes == 0:
            return
        block, staging = self._pinned(view.nbytes)
        staging[...] = np.frombuffer(view, np.uint8)  # the caller may reuse src at once
        stream = self._current()
        self._depend(stream, [dst])
        self._copy(stream, buf.handle.ptr, staging.ctypes.data, view.nbytes, _H2D)
        seq = stream.record()
        event = stream.hold((block, buf))
        if isinstance(dst, Tensor):
            mark_written((dst,), stream, seq)
        await wait_event(event, "copy_htod", self._backend._failed)

    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        self._backend._check_usable()
        buf = self._host_destination(dst, src)
        if dst.nbytes == 0:
            return
        stream = self._current()
        self._depend(stream, [src])
        block, staging = self._pinned(dst.nbytes)
        self._copy(stream, staging.ctypes.data, buf.handle.ptr, dst.nbytes, _D2H)
        stream.record()
        event = stream.hold((block, buf))
        await wait_event(event, "copy_dtoh", self._backend._failed)
        dst.reshape(-1).view(np.uint8)[...] = staging

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        self._backend._check_usable()
        d, s = self._device_pair(dst, src)
        if s.nbytes == 0:
            return
        stream = self._current()
        self._depend(stream, [t for t in (src, dst) if isinstance(t, Tensor)])
        self._copy(stream, d.handle.ptr, s.handle.ptr, s.nbytes, _D2D)
        seq = stream.record((d, s) if stream.track else ())
        if isinstance(dst, Tensor):
            mark_written((dst,), stream, seq)

    # -- tensor transfers -------------------------------------------------------------------------
    def _read(self, tensor: Tensor) -> tuple[np.ndarray[Any, Any], Any, CUDAStream]:
        self._backend._check_usable()
        check_tensor(self._backend, tensor, "tensor")
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        stream: CUDAStream = last_writer(tensor)[0]  # type: ignore[assignment]
        if out.nbytes == 0:
            return out, None, stream
        # On the writer's stream: in order after the writer, with no cross-stream dependency.
        block, staging = self._pinned(out.nbytes)
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
