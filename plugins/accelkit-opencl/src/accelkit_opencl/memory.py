"""The OpenCL backend's memory manager: ``cl.Buffer`` blocks from a caching pool.

Host transfers are real asynchronous copies: a non-blocking ``enqueue_copy`` after the source's
last writer, whose event is awaited without blocking the loop. The host side of a copy is kept
alive by the stream until the copy has completed, even if the awaiting task is cancelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from accelkit._core.pool import CachingPool
from accelkit._core.pooled_memory import PooledMemoryManager
from accelkit._core.validation import check_tensor
from accelkit.abc.memory import DeviceBuffer
from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.tensor import Tensor
from accelkit_opencl.stream import CLStream, wait_cl_event, wait_cl_event_blocking
from accelkit_opencl.submit import dependencies

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend

__all__ = ["OpenCLMemoryManager"]

_OUT_OF_MEMORY = {
    cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
    cl.status_code.OUT_OF_RESOURCES,
    cl.status_code.OUT_OF_HOST_MEMORY,
    cl.status_code.INVALID_BUFFER_SIZE,
}


def _raw_alloc(context: Any) -> Any:
    def alloc(size: int) -> Any:
        try:
            return cl.Buffer(context, cl.mem_flags.READ_WRITE, size)
        except cl.Error as exc:
            if exc.code in _OUT_OF_MEMORY:
                raise MemoryError(str(exc)) from None
            raise

    return alloc


def _raw_free(handle: Any) -> None:
    handle.release()


class OpenCLMemoryManager(PooledMemoryManager):
    def __init__(
        self,
        backend: OpenCLBackend,
        device: Device,
        context: Any,
        total_bytes: int,
        config: MemoryPoolConfig,
    ) -> None:
        super().__init__(
            backend, CachingPool(device, _raw_alloc(context), _raw_free, total_bytes, config)
        )
        self._backend: OpenCLBackend = backend

    def _settle(self) -> None:
        self._backend._prune_streams()

    def _current(self) -> CLStream:
        return self._backend.current_stream  # type: ignore[return-value]

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        buf = self._buffer(buffer, "buffer")
        # Stream-ordered: with one (in-order) queue, every later command runs after every command
        # already queued, so the block may be reused at once. With several, the pool may hand it
        # to any queue next, so it returns once the work queued so far on all of them is done.
        if len(self._backend._streams) < 2:
            self.pool.free(buf)
            return
        busy = self._backend._busy_events()
        if not busy:
            self.pool.free(buf)
        else:
            self.pool.free(buf, lambda recycle: self._backend._after_events(busy, recycle))

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self._host_source(dst, src)
        if view.nbytes == 0:
            return
        data = np.frombuffer(view, np.uint8).copy()  # the caller may reuse src at once
        stream = self._current()
        # After every use of dst queued so far (readers and the writer on other streams too).
        deps = dependencies(stream, [dst]) if isinstance(dst, Tensor) else []
        event = cl.enqueue_copy(stream.queue, buf.handle, data, is_blocking=False, wait_for=deps)
        seq = stream.record(event, (buf, data))
        if isinstance(dst, Tensor):
            dst._stream, dst._seq = stream, seq
        await wait_cl_event(event, stream.queue, "copy_htod")

    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        buf = self._host_destination(dst, src)
        if dst.nbytes == 0:
            return
        stream = self._current()
        deps = dependencies(stream, [src]) if isinstance(src, Tensor) else []
        # Copied into a staging array the stream keeps alive, so that a cancelled wait never
        # leaves the device writing into the caller's array later.
        staging = np.empty(dst.nbytes, np.uint8)
        event = cl.enqueue_copy(stream.queue, staging, buf.handle, is_blocking=False, wait_for=deps)
        stream.record(event, (buf, staging))
        await wait_cl_event(event, stream.queue, "copy_dtoh")
        dst.reshape(-1).view(np.uint8)[...] = staging

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self._device_pair(dst, src)
        if s.nbytes == 0:
            return
        stream = self._current()
        tensors = [t for t in (src, dst) if isinstance(t, Tensor)]
        event = cl.enqueue_copy(
            stream.queue,
            d.handle,
            s.handle,
            byte_count=s.nbytes,
            wait_for=dependencies(stream, tensors) or None,
        )
        seq = stream.record(event, (d, s))
        if isinstance(dst, Tensor):
            dst._stream, dst._seq = stream, seq

    # -- statistics and pool ----------------------------------------------------------------------
    # -- tensor transfers -------------------------------------------------------------------------
    def _read(self, tensor: Tensor) -> tuple[np.ndarray[Any, Any], Any, CLStream]:
        check_tensor(self._backend, tensor, "tensor")
        out = np.empty(tensor._shape, tensor._dtype.to_numpy())
        if out.nbytes == 0:
            return out, None, tensor._stream  # type: ignore[return-value]
        # Read on the writer's queue: in order after the writer, with no cross-queue dependency.
        stream: CLStream = tensor._stream  # type: ignore[assignment]
        event = cl.enqueue_copy(stream.queue, out, tensor._data, is_blocking=False)
        stream.record(event, (tensor._buffer, out))
        return out, event, stream

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out, event, stream = self._read(tensor)
        if event is not None:
            await wait_cl_event(event, stream.queue, "reading a tensor")
        stream.raise_errors(tensor._seq)  # an error of the kernel that wrote it (or an earlier one)
        return out

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out, event, stream = self._read(tensor)
        if event is not None:
            wait_cl_event_blocking(event, stream.queue, "reading a tensor")
        stream.raise_errors(tensor._seq)
        return out
