"""How CUDA components allocate outputs and submit work on the current stream.

Nothing here makes a CUDA call on the caller's thread: a tensor's CuPy array is built where it is
first used, on the submission thread (:class:`Storage`), and work is a closure queued there
(:meth:`CUDAComponent._launch`, see :mod:`accelkit_cuda.stream`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from accelkit.dtype import DType
from accelkit.errors import AccelError, InvalidArgumentError, OutOfMemoryError
from accelkit.sdk import DeviceBuffer, last_writer, mark_written, new_tensor, view_of
from accelkit.sdk import storage as native
from accelkit.tensor import Tensor
from accelkit_cuda.stream import CUDAStream

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["CUDAComponent", "Storage", "depend", "device_array", "numpy_dtype", "storage", "xa"]


def _numpy_dtypes() -> dict[DType, Any]:
    from accelkit_cuda.probe import cupy_bf16

    table: dict[DType, Any] = {d: d.to_numpy() for d in DType if d is not DType.BF16}
    if cupy_bf16():
        table[DType.BF16] = DType.BF16.to_numpy()
    return table


_NUMPY: dict[DType, Any] = _numpy_dtypes()


def numpy_dtype(dtype: DType) -> Any:
    return _NUMPY[dtype]


class Storage:
    """A tensor's memory as its kernels see it: the CuPy array over its buffer's pooled block,
    built on first use (on the submission thread, after the block's ``cudaMalloc`` ran there).
    The array holds the *buffer*, so the pool cannot recycle the block while it exists."""

    __slots__ = ("_array", "buffer", "device_id", "dtype", "shape")

    def __init__(
        self, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: DType, device_id: int
    ) -> None:
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        self.device_id = device_id
        self._array: Any = None

    def array(self) -> Any:
        arr = self._array
        if arr is None:
            arr = self._array = device_array(self.buffer, self.device_id, self.shape, self.dtype)
        return arr

    def reshaped(self, shape: tuple[int, ...]) -> Storage:
        return Storage(self.buffer, shape, self.dtype, self.device_id)


def storage(x: Tensor) -> Any:
    """The CuPy array behind a tensor (on the submission thread only)."""
    s: Storage = native(x)
    return s.array()


def xa(x: Any) -> Any:
    """The CuPy array behind a tensor (or the scalar itself)."""
    return storage(x) if type(x) is Tensor else x


def device_array(buffer: DeviceBuffer, device_id: int, shape: tuple[int, ...], dtype: DType) -> Any:
    """A CuPy array over a pooled buffer's block (on the submission thread: its pointer is 0
    until the block's ``cudaMalloc`` has run there)."""
    from accelkit_cuda.memory import memptr

    block = buffer.handle
    if not block.ptr:
        size = 1
        for d in shape:
            size *= d
        if size == 0:
            return cupy.empty(shape, _NUMPY[dtype])
        if isinstance(block.error, AccelError):  # a sticky fault at its cudaMalloc
            raise block.error
        raise OutOfMemoryError(
            f"a {block.size}-byte block could not be allocated: {block.error or 'freed'}"
        )
    return cupy.ndarray(shape, _NUMPY[dtype], memptr=memptr(buffer, device_id))


def depend(stream: CUDAStream, inputs: Iterable[Any]) -> list[CUDAStream]:
    """The other streams whose pending work writes the inputs (``stream`` waits for them on the
    device). Pure Python: no CUDA call."""
    seen: dict[int, CUDAStream] = {}
    for t in inputs:
        if type(t) is Tensor:
            writer, seq = last_writer(t)
            s: CUDAStream = writer  # type: ignore[assignment]
            if s is not stream and seq > s._completed_upto:
                seen[id(s)] = s
    return list(seen.values())


class CUDAComponent:
    """Allocation and submission shared by the CUDA backend's components."""

    backend: CUDABackend

    def __init__(self, backend: CUDABackend) -> None:
        self.backend = backend

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        backend = self.backend
        size = 1
        for d in shape:
            size *= d
        if dtype not in _NUMPY:
            raise InvalidArgumentError(
                f"the CUDA backend holds no {dtype.value} tensors with this CuPy"
                " (bf16 needs CuPy 14 and ml_dtypes)"
            )
        backend._prune_streams()  # deferred frees return to the pool first
        buf = backend.pool.allocate(size * dtype.itemsize)
        stream = backend._stream_var.get() or backend._default
        assert stream is not None
        data = Storage(buf, shape, dtype, backend._device_obj.index)
        return new_tensor(backend, buf, data, shape, dtype, backend._device_obj, stream)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        self.backend._check_usable()
        s: Storage = native(x)
        return view_of(x, shape, s.reshaped(shape))

    @property
    def _stream(self) -> CUDAStream:
        backend = self.backend
        stream = backend._stream_var.get() or backend._default
        assert stream is not None
        return stream  # type: ignore[return-value]

    def _launch(
        self,
        fn: Callable[[], object],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        keepalive: Iterable[Any] = (),
        what: str = "a kernel",
    ) -> int:
        """Submit ``fn`` (which launches CuPy or NVRTC kernels) on the current stream, after the
        inputs' writers on other streams; record the outputs as written by it. Returns at once;
        ``fn`` runs on the submission thread, and its errors are raised by the await that
        covers the outputs."""
        backend = self.backend
        backend._check_usable()
        stream = self._stream
        inputs = [t for t in inputs if t is not None]
        outputs = list(outputs)
        keep = (*inputs, *outputs, *keepalive) if stream.track else tuple(keepalive)
        seq = stream.submit(fn, keep, depend(stream, inputs), what)
        mark_written(outputs, stream, seq)
        return seq

    def _launch_checked(
        self,
        fn: Callable[[], Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        error: Callable[[int, int], BaseException],
    ) -> None:
        """Like :meth:`_launch`, for work that finds bad input only on the device.

        ``fn()`` returns a CuPy int64 array of two elements: ``[flag, value]``; once the work has
        completed, ``error(flag, value)`` is raised to whoever awaits the outputs if ``flag`` is set.
        The flag is copied to pinned host memory in the same stream, so checking it is free.
        """
        self.backend._check_usable()  # before anything is queued
        stream = self._stream
        cell: list[np.ndarray[Any, Any]] = []
        # The pinned flag is allocated on the submission thread; a CUDA error there is
        # translated (and a sticky one poisons the backend) by the stream (as_accel_error).

        def run() -> Any:
            flag = fn()
            pinned = cupy.cuda.alloc_pinned_memory(16)
            host = np.frombuffer(pinned, np.int64, 2)
            cupy.cuda.runtime.memcpyAsync(
                host.ctypes.data, flag.data.ptr, 16, cupy.cuda.runtime.memcpyDeviceToHost,
                stream.cp.ptr,
            )  # fmt: skip
            cell.append(host)
            return pinned, flag  # alive until the copy has completed

        seq = self._launch(run, inputs, outputs)

        def check() -> BaseException | None:
            if not cell or not cell[0][0]:
                return None
            host = cell[0]
            return error(int(host[0]), int(host[1]))

        stream.add_check(seq, check)

    def _skip(self, outputs: Iterable[Tensor]) -> None:
        stream = self._stream
        mark_written(outputs, stream, 0)
