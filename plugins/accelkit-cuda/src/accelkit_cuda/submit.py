"""How CUDA components allocate outputs and submit work on the current stream.

Nothing here makes a CUDA call on the caller's thread: a tensor's CuPy array is built where it is
first used, on the submission thread (:class:`Storage`), and work is a closure queued there
(:meth:`CUDAComponent.submit`, under :meth:`accelkit.sdk.KernelBase.launch`; see
:mod:`accelkit_cuda.stream`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from accelkit.dtype import DType
from accelkit.errors import AccelError, InvalidArgumentError, OutOfMemoryError
from accelkit.sdk import DeviceBuffer, KernelBase, PositionStream
from accelkit.sdk import storage as native
from accelkit.tensor import Tensor
from accelkit_cuda.capturing import is_collecting
from accelkit_cuda.stream import CUDAStream, block_failure

if TYPE_CHECKING:
    from accelkit_cuda.backend import CUDABackend

__all__ = [
    "CUDAComponent", "Storage", "block_error", "device_array", "numpy_dtype", "storage", "xa",
]  # fmt: skip


def _numpy_dtypes() -> dict[DType, Any]:
    from accelkit_cuda.probe import cupy_bf16

    table: dict[DType, Any] = {d: d.to_numpy() for d in DType if d is not DType.BF16}
    if cupy_bf16():
        table[DType.BF16] = DType.BF16.to_numpy()
    return table


_NUMPY: dict[DType, Any] = _numpy_dtypes()

#: Whether a CUDA stream's ``prune`` does anything (the base class's does nothing): where it
#: does not, an allocation prunes the streams only for a poisoned backend or deferred frees.
_STREAMS_PRUNE = CUDAStream.prune is not PositionStream.prune


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
        raise block_error(block)
    return cupy.ndarray(shape, _NUMPY[dtype], memptr=memptr(buffer, device_id))


def block_error(block: Any) -> AccelError:
    """Why a non-empty tensor's pooled block has no memory (``block.ptr`` is 0): the error of
    its ``cudaMalloc`` (a sticky fault as it was raised), else out of memory, which the streams
    raise once for the block (:func:`~accelkit_cuda.stream.block_failure`)."""
    if isinstance(block.error, AccelError):  # a sticky fault at its cudaMalloc
        return block.error
    error = OutOfMemoryError(
        f"a {block.size}-byte block could not be allocated: {block.error or 'freed'}"
    )
    return error if block.error is None else block_failure(error, block)


class CUDAComponent(KernelBase[CUDAStream]):
    """Allocation and submission shared by the CUDA backend's kernel objects, on
    :class:`~accelkit.sdk.KernelBase`: a tensor's storage is a :class:`Storage` (its CuPy array
    is made on the submission thread), and a launch is a closure queued for that thread on the
    current stream (:meth:`submit`)."""

    backend: CUDABackend

    # -- KernelBase's hooks -----------------------------------------------------------------------
    def make_storage(self, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: DType) -> Storage:
        return Storage(buffer, shape, dtype, self.backend.device_index)

    def reshape_storage(self, x: Tensor, shape: tuple[int, ...]) -> Storage:
        self.backend._check_usable()
        s: Storage = native(x)
        return s.reshaped(shape)

    def check_output(self, shape: tuple[int, ...], dtype: DType) -> None:
        # Before the pool is asked (KernelBase.empty): a refused dtype queues no cudaMalloc,
        # takes no block, and is refused as such even over a memory limit.
        if dtype not in _NUMPY:
            raise InvalidArgumentError(
                f"the CUDA backend holds no {dtype.value} tensors with this CuPy"
                " (bf16 needs CuPy 14 and ml_dtypes)"
            )

    def before_allocation(self) -> None:
        # A poisoned backend refuses and deferred frees return first (prune_streams); with
        # neither, pruning has nothing to do (a CUDA stream releases its work's references
        # on its completer, not here: _STREAMS_PRUNE), and five calls are saved an op.
        backend = self.backend
        if backend._poisoned is not None or backend.deferred_pending or _STREAMS_PRUNE:
            backend.prune_streams()

    def submit(
        self,
        stream: CUDAStream,
        fn: Callable[..., Any],
        deps: list[tuple[Any, int]],
        hold: tuple[Any, ...],
        what: str = "a kernel",
        keepalive: tuple[Any, ...] = (),
        inline: bool | Callable[[], bool] = False,
        **options: Any,
    ) -> int:
        """Queue ``fn`` (which launches CuPy or NVRTC kernels) on ``stream``, after the pending
        writers ``deps`` on other streams. Returns at once; ``fn`` runs on the submission
        thread, and its errors are raised by the await that covers the outputs (``what`` names
        it there). ``keepalive`` (and, with more than one stream, the tensors in ``hold``) stay
        referenced until the work has completed; with one stream, stream order alone keeps a
        recycled block from being reused early. ``inline``: ``fn`` is a plain launch (or a
        function saying so in the submission thread's turn), which the stream may make on this
        thread (:data:`accelkit_cuda.stream.INLINE`)."""
        keep = (hold, keepalive) if stream.track else keepalive
        return stream.submit(fn, keep, deps, what, inline)

    # -- the CUDA backend's own -------------------------------------------------------------------
    def _launch_checked(
        self,
        fn: Callable[[], Any],
        inputs: Iterable[Any],
        outputs: Iterable[Tensor],
        error: Callable[[int, int], BaseException],
    ) -> None:
        """Like :meth:`launch`, for work that finds bad input only on the device.

        ``fn()`` returns a CuPy int64 array of two elements: ``[flag, value]``; once the work has
        completed, ``error(flag, value)`` is raised to whoever awaits the outputs if ``flag`` is set.
        The flag is copied to pinned host memory in the same stream, so checking it is free.
        """
        self.backend._check_usable()  # before anything is queued
        stream = self.current_stream
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

        seq = self.launch(run, inputs, outputs)
        if is_collecting():
            # Collected for a CUDA graph (graphs._collect): the copy of the flag becomes a node
            # of the graph, run at each replay; its host buffer holds nothing before that, and
            # ``seq`` is a position handed out already. No check (a graph does not repeat them).
            return

        def check() -> BaseException | None:
            if not cell or not cell[0][0]:
                return None
            host = cell[0]
            return error(int(host[0]), int(host[1]))

        stream.add_check(seq, check)
