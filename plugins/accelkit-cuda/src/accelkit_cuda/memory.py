"""The CUDA backend's memory manager: device blocks from a caching pool, pinned host transfers.

Blocks are ```cudaMalloc`` allocations (:class:`Block`, wrapped for CuPy as unowned memory) handed out by the core's
:class:`~accelkit._core.pool.CachingPool`, which keeps the exact statistics, the limit and
``trim()``. A freed block is reused at once by later work on the same stream (stream order makes
that safe). With more than one stream, submissions keep their tensors alive until an event after
them has completed, and an explicit ``free`` returns the block once the other streams have passed
the point where it was freed, so no stream is handed a block another is still using.

Every CUDA call here runs on the backend's submission thread (:mod:`accelkit_cuda.submission`):
a pool miss queues the block's ``cudaMalloc`` there (its pointer exists before any work that
uses it runs, since that work is queued after it), and a release queues its ``cudaFree``.

Host transfers are real asynchronous copies through pinned (page-locked) staging memory from
CuPy's pinned pool, allocated on the submission thread: ``cudaMemcpyAsync`` on the stream, awaited
without blocking the loop; the copy between the staging block and the caller's array runs on a
worker thread when large (``sdk.host.copy_into``). The staging block stays alive until the copy
completes, even if the awaiting task is cancelled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
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
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream
from accelkit_cuda.submit import depend

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend
    from accelkit_cuda.submission import SubmissionThread

__all__ = ["Block", "CUDAMemoryManager", "Context", "memptr", "pinned_empty"]

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2
_D2D = 3


class Context:
    """A backend's CUDA context generation, shared with its blocks (bumped by a rebuild), and
    the submission thread where its blocks are allocated and freed."""

    __slots__ = ("device_id", "generation", "thread")

    def __init__(self, device_id: int, thread: SubmissionThread | None = None) -> None:
        self.device_id = device_id
        self.generation = 1
        self.thread = thread


class Block:
    """One ``cudaMalloc`` allocation. It frees itself when released by the pool or when its last
    reference goes (a tensor that outlived the backend's shutdown), but only in the context
    generation it was made in: after a rebuild its pointer is dead, and the same value may name
    a new allocation.

    Both calls run on the context's submission thread: ``ptr`` is 0 until the ``cudaMalloc``
    queued at allocation has run there (every use of the block is queued after it), and stays 0
    with ``error`` set if it failed; a release queues the ``cudaFree``."""

    __slots__ = ("context", "error", "freed", "generation", "ptr", "size")

    def __init__(self, ptr: int, size: int, context: Context) -> None:
        self.ptr = ptr
        self.size = size
        self.context = context
        self.generation = context.generation
        self.error: BaseException | None = None
        self.freed = False

    def release(self) -> None:
        if self.freed:
            return
        self.freed = True
        thread = self.context.thread
        if thread is None or thread.on_thread():
            self._free()
        else:
            thread.submit(self._free)  # after the queued malloc, and the work queued so far

    def _free(self) -> None:
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
        block = Block(0, size, backend._context)

        def malloc() -> None:
            try:
                try:
                    block.ptr = _malloc(size)
                except MemoryError:
                    # CuPy's own pool (temporaries of its kernels) and the free blocks of ours
                    # may hold the memory: return them to the driver and try once more.
                    cupy.get_default_memory_pool().free_all_blocks()
                    backend.pool.trim()
                    block.ptr = _malloc(size)
            except BaseException as exc:
                block.error = exc

        backend._thread.submit(malloc)
        return block

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
        points = [s.position() for s in streams]
        self.pool.free(buf, lambda recycle: self._backend._after_events(points, recycle))

    def _submit_copy(
        self, stream: CUDAStream, dst: Any, src: Any, nbytes: int, kind: int,
        inputs: Sequence[Any], keep: tuple[Any, ...], what: str,
    ) -> int:  # fmt: skip
        """Queue ``cudaMemcpyAsync(dst(), src(), ...)`` on ``stream`` (pointers are read on the
        submission thread, where the blocks' mallocs ran); returns its position."""
        self._backend._check_usable()

        def run() -> None:
            cupy.cuda.runtime.memcpyAsync(dst(), src(), nbytes, kind, stream.cp.ptr)

        return stream.submit(run, keep, depend(stream, inputs), what)

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self._host_source(dst, src)
        if view.nbytes == 0:
            return
        thread = self._backend._thread
        block, staging = await thread.call(lambda: pinned_empty(view.nbytes))
        await copy_into(staging, np.frombuffer(view, np.uint8))  # off the loop when large
        stream = self._current()
        handle = buf.handle
        seq = self._submit_copy(
            stream, lambda: handle.ptr, lambda: staging.ctypes.data, view.nbytes, _H2D, [dst],
            (block, staging, buf), "copy_htod",
        )  # fmt: skip
        if isinstance(dst, Tensor):
            mark_written((dst,), stream, seq)
        await stream.wait_for(seq)

    def _to_staging(
        self, stream: CUDAStream, buf: DeviceBuffer, nbytes: int, inputs: Sequence[Any],
        what: str,
    ) -> tuple[int, list[np.ndarray[Any, Any]]]:  # fmt: skip
        """Queue a copy of ``buf`` into pinned memory allocated there; returns the position and
        a list that holds the pinned array once the submission thread has made it."""
        self._backend._check_usable()
        cell: list[np.ndarray[Any, Any]] = []
        handle = buf.handle

        def run() -> Any:
            block, staging = pinned_empty(nbytes)
            cupy.cuda.runtime.memcpyAsync(
                staging.ctypes.data, handle.ptr, nbytes, _D2H, stream.cp.ptr
            )
            cell.append(staging)
            return block

        return stream.submit(run, (buf,), depend(stream, inputs), what), cell

    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        buf = self._host_destination(dst, src)
        if dst.nbytes == 0:
            return
        stream = self._current()
        seq, cell = self._to_staging(stream, buf, dst.nbytes, [src], "copy_dtoh")
        await stream.wait_for(seq)
        await copy_into(dst.reshape(-1).view(np.uint8), cell[0])

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self._device_pair(dst, src)
        if s.nbytes == 0:
            return
        stream = self._current()
        dh, sh = d.handle, s.handle
        seq = self._submit_copy(
            stream, lambda: dh.ptr, lambda: sh.ptr, s.nbytes, _D2D,
            [t for t in (src, dst) if isinstance(t, Tensor)], (d, s) if stream.track else (),
            "copy_dtod",
        )  # fmt: skip
        if isinstance(dst, Tensor):
            mark_written((dst,), stream, seq)

    # -- tensor transfers -------------------------------------------------------------------------
    def _read(self, tensor: Tensor) -> tuple[int, list[np.ndarray[Any, Any]], CUDAStream]:
        check_tensor(self._backend, tensor, "tensor")
        stream: CUDAStream = last_writer(tensor)[0]  # type: ignore[assignment]
        # On the writer's stream: in order after the writer, with no cross-stream dependency.
        seq, cell = self._to_staging(
            stream, buffer_of(tensor), tensor.nbytes, [], "reading a tensor"
        )
        return seq, cell, stream

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        if out.nbytes == 0:
            check_tensor(self._backend, tensor, "tensor")
            return out
        seq, cell, stream = self._read(tensor)
        await stream.wait_for(seq)
        stream.raise_errors(last_writer(tensor)[1])
        # Out of the pinned staging block, off the event loop when large (sdk.host).
        await copy_into(out.reshape(-1).view(np.uint8), cell[0])
        return out

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        if out.nbytes == 0:
            check_tensor(self._backend, tensor, "tensor")
            return out
        seq, cell, stream = self._read(tensor)
        stream.wait_for_blocking(seq)
        stream.raise_errors(last_writer(tensor)[1])
        out.reshape(-1).view(np.uint8)[...] = cell[0]
        return out
