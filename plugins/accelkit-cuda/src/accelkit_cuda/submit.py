"""How CUDA components allocate outputs and launch work on the current stream."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from accelkit.dtype import DType
from accelkit.errors import DeviceError, InvalidArgumentError, OutOfMemoryError
from accelkit.sdk import last_writer, mark_written, new_tensor, storage, view_of
from accelkit.tensor import Tensor
from accelkit_cuda.errors import translate
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = ["CUDAComponent", "depend", "device_array", "xa"]

_NUMPY: dict[DType, Any] = {d: d.to_numpy() for d in DType if d is not DType.BF16}


def xa(x: Any) -> Any:
    """The CuPy array behind a tensor (or the scalar itself)."""
    return storage(x) if type(x) is Tensor else x


def device_array(backend: CUDABackend, buffer: Any, shape: tuple[int, ...], dtype: DType) -> Any:
    """A CuPy array over a pooled block."""
    from accelkit_cuda.memory import memptr

    return cupy.ndarray(shape, _NUMPY[dtype], memptr=memptr(buffer, backend._device_obj.index))


def depend(stream: CUDAStream, inputs: Iterable[Any]) -> None:
    """Make ``stream`` wait (on the device) for the inputs' writers on other streams."""
    seen: set[int] = set()
    for t in inputs:
        if type(t) is Tensor:
            writer, seq = last_writer(t)
            s: CUDAStream = writer  # type: ignore[assignment]
            if s is not stream and id(s) not in seen and seq > s._completed_upto:
                seen.add(id(s))
                stream.cp.wait_event(s.event_now())


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
        if dtype is DType.BF16:
            raise InvalidArgumentError("the CUDA backend holds no bf16 tensors (CuPy has no bf16)")
        backend._prune_streams()  # deferred frees return to the pool first
        buf = backend.pool.allocate(size * dtype.itemsize)
        stream = backend._stream_var.get() or backend._default
        assert stream is not None
        data = device_array(backend, buf, shape, dtype)
        return new_tensor(backend, buf, data, shape, dtype, backend._device_obj, stream)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        self.backend._check_usable()
        return view_of(x, shape, storage(x).reshape(shape))

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
        """Run ``fn`` (which launches CuPy or NVRTC kernels) on the current stream, after the
        inputs' writers on other streams; record the outputs as written by it."""
        backend = self.backend
        backend._check_usable()
        stream = self._stream
        inputs = [t for t in inputs if t is not None]
        outputs = list(outputs)
        try:
            with backend._cp_device, stream.cp:
                depend(stream, inputs)
                fn()
        except CUDA_ERRORS as exc:
            raise backend._failed(translate(exc, what)) from None
        except cupy.cuda.memory.OutOfMemoryError as exc:  # a temporary of a CuPy kernel
            raise OutOfMemoryError(f"{what}: the device is out of memory ({exc})") from None
        except Exception as exc:
            if type(exc).__name__ in ("CUBLASError", "CUSOLVERError", "CURANDError"):
                raise DeviceError(f"{what}: {exc}") from None
            raise
        seq = stream.record((*inputs, *outputs, *keepalive) if stream.track else ())
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
        self.backend._check_usable()
        try:
            pinned = cupy.cuda.alloc_pinned_memory(16)
        except CUDA_ERRORS as exc:
            raise self.backend._failed(translate(exc, "a pinned flag")) from None
        host = np.frombuffer(pinned, np.int64, 2)
        outputs = list(outputs)

        def run() -> None:
            flag = fn()
            host_ptr = host.ctypes.data
            cupy.cuda.runtime.memcpyAsync(
                host_ptr, flag.data.ptr, 16, cupy.cuda.runtime.memcpyDeviceToHost,
                self._stream.cp.ptr,
            )  # fmt: skip
            keep.append(flag)

        keep: list[Any] = [pinned]
        seq = self._launch(run, inputs, outputs, keep)

        def check() -> BaseException | None:
            return error(int(host[0]), int(host[1])) if host[0] else None

        self._stream.add_check(seq, check)
        # The pinned block and the flag must outlive the copy even if nobody awaits: the
        # stream's transfer list holds them until an event after the copy has completed.
        self._stream.hold(keep)

    def _skip(self, outputs: Iterable[Tensor]) -> None:
        stream = self._stream
        mark_written(outputs, stream, 0)
