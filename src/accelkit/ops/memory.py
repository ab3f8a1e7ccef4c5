"""``MemoryManager``: the memory manager of every backend, over its :class:`~accelkit.sdk.MemoryKernels`.

As :class:`~accelkit.ops.TensorOps` is over a backend's TensorKernels: every argument is checked
here, once, for every backend (readiness, live buffers and tensors of this backend, byte counts,
a writable C-contiguous host array), with the same errors and messages everywhere; the
statistics, the pool settings, ``trim`` and ``reset_peak`` are the pool's. Then the backend's
memory kernels do the raw part: a stream-ordered free, the copies, reading a tensor. Where the
host reads device memory once its writers have completed (``MemoryKernels.wait_for_writers``),
the waits for those writers are here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.validation import check_int, check_tensor
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.errors import InvalidArgumentError, StaleHandleError
from accelkit.sdk.tensors import pending_writes
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.pool import CachingPool
    from accelkit._core.stream_backend import StreamBackend
    from accelkit.memory import MemoryInfo, MemoryPoolConfig
    from accelkit.sdk.kernels import MemoryKernels

__all__ = ["MemoryManager"]


def _after_raw_writers(stream: Any, *buffers: DeviceBuffer | None) -> None:
    """Order the next submission to ``stream`` after the last write of each raw buffer given
    (its ``last_write``) queued on another stream and not yet done: the kernels order their
    work after the writers of the tensors they are given, never of a raw buffer."""
    for raw in buffers:
        if raw is not None and raw.last_write is not None:
            writer = raw.last_write[0]
            if writer is not stream and not writer.query():
                stream.wait_event(writer.record_event())


class MemoryManager(DeviceMemoryManager):
    """A backend's :class:`~accelkit.abc.DeviceMemoryManager` (``backend.memory_manager``; see
    the module docstring). ``StreamBackend`` builds it over the memory kernels of the backend's
    ``Opened`` record; ``pool`` is theirs."""

    def __init__(self, backend: StreamBackend[Any], kernels: MemoryKernels) -> None:
        self.backend = backend
        #: The backend's memory kernels: the raw part, called with checked arguments.
        self.kernels = kernels
        self.pool: CachingPool = kernels.pool
        self._wait = kernels.wait_for_writers
        # Bound once: reading a small tensor is common, and this saves a lookup per read.
        self._check_ready = backend.check_ready
        self._read_tensor = kernels.read_tensor
        self._read_tensor_blocking = kernels.read_tensor_blocking

    # -- checks -----------------------------------------------------------------------------------
    def owned_buffer(self, obj: DeviceBuffer | Tensor, name: str) -> DeviceBuffer:
        """The live buffer of this backend's pool behind ``obj`` (a buffer or a tensor):
        StaleHandleError for a freed buffer or another backend's, InvalidArgumentError naming
        ``name`` for a wrong type or another backend's tensor. Kernel executors check their
        buffer arguments with it."""
        if isinstance(obj, Tensor):
            check_tensor(self.backend, obj, name)
            return obj._buffer
        if not isinstance(obj, DeviceBuffer):
            raise InvalidArgumentError(
                f"{name} must be a DeviceBuffer or a Tensor; got {type(obj).__name__}"
            )
        if obj._pool is not self.pool or not obj.is_alive:
            raise StaleHandleError(f"{name} {obj!r} was freed or belongs to another backend")
        return obj

    # -- buffers ----------------------------------------------------------------------------------
    def allocate(self, nbytes: int, alignment: int | None = None) -> DeviceBuffer:
        self.backend.check_ready()
        n = check_int(nbytes, "nbytes", minimum=0)
        if alignment is not None:
            a = check_int(alignment, "alignment", minimum=1)
            if a & (a - 1) or a > self.pool.alignment:
                raise InvalidArgumentError(
                    f"alignment must be a power of two up to {self.pool.alignment}; got {a}"
                )
        return self.pool.allocate(n)

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        if self.backend._capture is not None:
            self.backend._capture.refuse("memory_manager.free")
        buf = self.owned_buffer(buffer, "buffer")
        self.backend.check_ready()
        self.kernels.free(buf)

    # -- transfers --------------------------------------------------------------------------------
    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        if self.backend._capture is not None:
            self.backend._capture.refuse("copy_htod")
        buf = self.owned_buffer(dst, "dst")
        try:
            view = memoryview(src).cast("B")
        except TypeError as exc:
            raise InvalidArgumentError(
                f"copy_htod: src must support the buffer protocol: {exc}"
            ) from None
        if view.nbytes > buf.nbytes:
            raise InvalidArgumentError(
                f"copy_htod: src has {view.nbytes} bytes, dst only {buf.nbytes}"
            )
        self.backend.check_ready()
        if view.nbytes == 0:
            return
        data = await self.kernels.stage(np.frombuffer(view, np.uint8))
        buf = self.owned_buffer(dst, "dst")  # still live after the await
        if not isinstance(dst, Tensor) and buf.last_write is not None:
            # a copy into the raw buffer queued on another stream must not land after this
            await buf.last_write[0].wait_for(buf.last_write[1])
            buf = self.owned_buffer(dst, "dst")
        await self.kernels.write(buf, data, dst if isinstance(dst, Tensor) else None)

    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        if self.backend._capture is not None:
            self.backend._capture.refuse("copy_dtoh (a host read)")
        buf = self.owned_buffer(src, "src")
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise InvalidArgumentError("copy_dtoh: dst must be a writable C-contiguous NumPy array")
        if dst.nbytes > buf.nbytes:
            raise InvalidArgumentError(
                f"copy_dtoh: dst has {dst.nbytes} bytes, src only {buf.nbytes}"
            )
        self.backend.check_ready()
        if dst.nbytes == 0:
            return
        tensor = src if isinstance(src, Tensor) else None
        if self._wait:
            if tensor is not None:
                for stream, seq in pending_writes(tensor):
                    await stream.wait_for(seq)
            elif buf.last_write is not None:
                await buf.last_write[0].wait_for(buf.last_write[1])
            await self.backend.current_stream.synchronize()
            buf = self.owned_buffer(src, "src")  # still live after the awaits
        elif tensor is None:  # the read is queued on the current stream: after the writer
            _after_raw_writers(self.backend.current_stream, buf)
        await self.kernels.read(dst.reshape(-1).view(np.uint8), buf, tensor)

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self.owned_buffer(dst, "dst"), self.owned_buffer(src, "src")
        if s.nbytes > d.nbytes:
            raise InvalidArgumentError(f"copy_dtod: src has {s.nbytes} bytes, dst only {d.nbytes}")
        self.backend.check_ready()
        if s.nbytes == 0:
            return
        dst_tensor = dst if isinstance(dst, Tensor) else None
        src_tensor = src if isinstance(src, Tensor) else None
        # The kernels order a copy after the writers of the tensors it is given; a raw buffer's
        # writer (its last_write) is ordered here, and the copy recorded as its writer, so
        # that a read on another stream or by the host waits for it (a read of a raw buffer
        # written on another stream returned the old contents).
        stream = self.backend.current_stream
        _after_raw_writers(stream, None if dst_tensor else d, None if src_tensor else s)
        self.kernels.copy(d, s, s.nbytes, dst_tensor, src_tensor)
        if dst_tensor is None:
            d.last_write = (stream, stream.submitted)

    # -- tensor transfers (Tensor.to_host, numpy, __dlpack__) ---------------------------------------
    # The two reads are every to_host() and numpy(): one frame each, with sdk.pending_writes
    # inlined (the tensor's writer, then the last write to its buffer through another view).
    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        if self.backend._capture is not None:
            self.backend._capture.refuse("to_host (a host read)")
        check_tensor(self.backend, tensor, "tensor")
        self._check_ready()
        if self._wait:
            stream, seq = tensor._stream, tensor._seq
            await stream.wait_for(seq)
            shared = tensor._buffer.last_write
            if shared is not None and (shared[0] is not stream or shared[1] != seq):
                await shared[0].wait_for(shared[1])
            if not tensor._buffer.is_alive:  # freed meanwhile: its block may be another's now
                check_tensor(self.backend, tensor, "tensor")
        return await self._read_tensor(tensor)

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        if self.backend._capture is not None:
            self.backend._capture.refuse("numpy() (a host read)")
        check_tensor(self.backend, tensor, "tensor")
        self._check_ready()
        if self._wait:
            stream, seq = tensor._stream, tensor._seq
            stream.wait_for_blocking(seq)
            shared = tensor._buffer.last_write
            if shared is not None and (shared[0] is not stream or shared[1] != seq):
                shared[0].wait_for_blocking(shared[1])
        return self._read_tensor_blocking(tensor)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        if self.backend._capture is not None:
            self.backend._capture.refuse("__dlpack__ (a host read)")
        check_tensor(self.backend, tensor, "tensor")
        self.backend.check_ready()
        self.kernels.dlpack_device(tensor)  # UnsupportedOperationError before any wait
        if self._wait:
            for s, seq in pending_writes(tensor):
                s.wait_for_blocking(seq)
        return self.kernels.export_dlpack(tensor, stream=stream, **kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        check_tensor(self.backend, tensor, "tensor")
        return self.kernels.dlpack_device(tensor)

    # -- statistics and the pool ------------------------------------------------------------------
    def memory_info(self) -> MemoryInfo:
        self.kernels.settle()
        return self.pool.info()

    def configure_pool(self, config: MemoryPoolConfig) -> None:
        self.kernels.settle()
        self.pool.configure(config)

    def trim(self) -> int:
        self.kernels.settle()
        return self.pool.trim()

    def reset_peak(self) -> None:
        self.kernels.settle()
        self.pool.reset_peak()
