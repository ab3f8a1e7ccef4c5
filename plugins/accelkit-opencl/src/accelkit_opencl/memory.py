"""The OpenCL backend's memory kernels: ``cl.Buffer`` blocks from a caching pool.

The core's memory manager checks every argument; these queue the copies. Host transfers are real
asynchronous copies: a non-blocking ``enqueue_copy`` after the source's last writer, enqueued by
the stream's submitter thread and awaited as a stream position, so that no OpenCL call runs on
the event loop's thread. The host side of a copy is kept alive by the stream until the copy has
completed, even if the awaiting task is cancelled. Host-side copies (snapshots, staging) above
:data:`LARGE_COPY` run on a worker thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pyopencl as cl

from accelkit.device import Device
from accelkit.errors import AccelError, DeviceError
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import (
    CachingPool,
    DeviceBuffer,
    MemoryKernels,
    buffer_of,
    last_writer,
    mark_written,
    other_writers,
    pending_writes,
    storage,
)
from accelkit.tensor import Tensor
from accelkit_opencl.stream import CLStream

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend

__all__ = ["LARGE_COPY", "OpenCLMemoryKernels"]

_log = logging.getLogger("accelkit.opencl")

#: Host-side copies larger than this (bytes) run off the event loop's thread.
LARGE_COPY = 1 << 20

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
            raise DeviceError(f"OpenCL could not allocate {size} bytes: {exc}") from exc

    return alloc


def _raw_free(handle: Any) -> None:
    try:
        handle.release()
    except cl.Error as exc:  # the buffer is gone either way; freeing must not raise
        _log.warning("accelkit-opencl: releasing a buffer failed: %s", exc)


class OpenCLMemoryKernels(MemoryKernels):
    """``cl.Buffer`` blocks; every copy is queued after its writers on the device (the core's
    memory manager checks the arguments and does not wait: ``wait_for_writers`` is false)."""

    backend: OpenCLBackend
    wait_for_writers = False

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

    def settle(self) -> None:
        self.backend.prune_streams()

    def _current(self) -> CLStream:
        return self.backend.current_stream

    def free(self, buffer: DeviceBuffer) -> None:
        # Stream-ordered: with one (in-order) queue, every later command runs after every command
        # already queued, so the block may be reused at once. With several, the pool may hand it
        # to any queue next, so it returns once the work queued so far on all of them is done
        # (positions, answered from the streams' counters: no OpenCL call here).
        streams = self.backend.streams
        if len(streams) < 2:
            self.pool.free(buffer)
            return
        busy = [s.position() for s in streams if not s.query()]
        if not busy:
            self.pool.free(buffer)
        else:
            self.pool.free(buffer, lambda recycle: self.backend.after_events(busy, recycle))

    # The core's snapshot of the caller's bytes (MemoryKernels.stage: off the loop when large)
    # is what the device reads: the caller may reuse src at once, after a cancelled wait too.
    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        stream = self._current()
        # After every use of dst queued so far (the writer on another stream too).
        deps = other_writers(stream, [dst]) if dst is not None else []
        handle = buffer.handle

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_copy(queue, handle, data, is_blocking=False, wait_for=wait_for)

        seq = stream.submit(run, (buffer, data), deps)
        if dst is not None:
            mark_written((dst,), stream, seq)
        await stream.reach(seq)
        stream.raise_failure(seq)

    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        stream = self._current()
        deps = other_writers(stream, [src]) if src is not None else []
        # Copied into a staging array the stream keeps alive, so that a cancelled wait never
        # leaves the device writing into the caller's array later.
        staging = np.empty(out.nbytes, np.uint8)
        handle = buffer.handle

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_copy(queue, staging, handle, is_blocking=False, wait_for=wait_for)

        seq = stream.submit(run, (buffer, staging), deps)
        await stream.reach(seq)
        stream.raise_failure(seq)
        if staging.nbytes > LARGE_COPY:
            await anyio.to_thread.run_sync(np.copyto, out, staging)
        else:
            out[...] = staging

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        stream = self._current()
        tensors = [t for t in (src_tensor, dst_tensor) if t is not None]
        dh, sh = dst.handle, src.handle

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_copy(queue, dh, sh, byte_count=nbytes, wait_for=wait_for)

        seq = stream.submit(run, (dst, src), other_writers(stream, tensors))
        if dst_tensor is not None:
            mark_written((dst_tensor,), stream, seq)

    # -- tensor transfers -------------------------------------------------------------------------
    def _read(self, tensor: Tensor) -> tuple[np.ndarray[Any, Any], int, CLStream]:
        out = np.empty(tensor.shape, tensor.dtype.to_numpy())
        # A tensor of this backend was written on one of its CLStreams (last_writer says
        # PositionStream).
        stream: CLStream = last_writer(tensor)[0]  # type: ignore[assignment]
        if out.nbytes == 0:
            return out, 0, stream
        # Read on the writer's queue: in order after the writer, and after a write of its
        # buffer through a view on another queue (other_writers).
        data = storage(tensor)

        def run(queue: Any, wait_for: list[Any] | None) -> Any:
            return cl.enqueue_copy(queue, out, data, is_blocking=False, wait_for=wait_for)

        deps = other_writers(stream, (tensor,))
        return out, stream.submit(run, (buffer_of(tensor), out), deps), stream

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out, seq, stream = self._read(tensor)
        if seq:
            await stream.reach(seq)
        for other, at in pending_writes(tensor)[1:]:  # a view's write: done, its error first
            await other.wait_for(at)
        self._raise(stream, seq, last_writer(tensor)[1])
        return out

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        out, seq, stream = self._read(tensor)
        if seq:
            stream.reach_blocking(seq)
        for other, at in pending_writes(tensor)[1:]:
            other.wait_for_blocking(at)
        self._raise(stream, seq, last_writer(tensor)[1])
        return out

    @staticmethod
    def _raise(stream: CLStream, seq: int, written: int) -> None:
        """After a read: the error of the work that wrote the tensor (or earlier work), else the
        read's own."""
        try:
            stream.raise_failure(seq)
        except AccelError as own:
            stream.raise_errors(written)
            raise own from None
        stream.raise_errors(written)
