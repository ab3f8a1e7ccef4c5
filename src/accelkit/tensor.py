"""``Tensor``: a handle to device memory with a shape and a dtype.

A tensor belongs to one backend and one device. Its memory is a :class:`~accelkit.abc.DeviceBuffer`
owned by that backend's memory manager; several tensors may share a buffer (``reshape`` returns a
view). Every tensor is dense and C-contiguous, which keeps every backend's kernels simple.

A tensor remembers the stream and the position in that stream of the operation that last wrote
it, so a transfer (``await t.to_host()``) waits for exactly that work and nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import StaleHandleError

if TYPE_CHECKING:
    from accelkit._core.positions import PositionStream
    from accelkit.abc.backend import ComputeBackend
    from accelkit.abc.memory import DeviceBuffer
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["Tensor"]

Scalar = int | float | bool


class Tensor:
    """A dense, C-contiguous array in a backend's device memory.

    Tensors are made by a backend's :class:`~accelkit.ops.TensorFactory` and by its operations,
    never by calling this class directly. Operators (``+ - * / @``, unary ``-``) are submissions to
    the owning backend's :class:`~accelkit.ops.TensorOps`: they return at once, and the result is
    observed by awaiting :meth:`to_host` (or :meth:`numpy` in a script).
    """

    __slots__ = (
        "__weakref__",
        "_backend",
        "_buffer",
        "_data",
        "_device",
        "_dtype",
        "_seq",
        "_shape",
        "_size",
        "_stream",
    )

    def __init__(
        self,
        backend: ComputeBackend,
        buffer: DeviceBuffer,
        data: Any,
        shape: tuple[int, ...],
        dtype: DType,
        device: Device,
        size: int,
        stream: PositionStream,
        seq: int,
    ) -> None:
        self._backend = backend
        self._buffer = buffer
        self._data = data
        self._shape = shape
        self._dtype = dtype
        self._device = device
        self._size = size
        self._stream = stream
        self._seq = seq

    # -- metadata -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def backend(self) -> ComputeBackend:
        return self._backend

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return self._size

    @property
    def nbytes(self) -> int:
        return self._size * self._dtype.itemsize

    @property
    def buffer(self) -> DeviceBuffer:
        """The device buffer holding this tensor's elements (shared with its views)."""
        return self._buffer

    @property
    def is_alive(self) -> bool:
        """False once the buffer was freed or its backend shut down or rebuilt its context."""
        return self._buffer.is_alive

    def __repr__(self) -> str:
        state = "" if self.is_alive else ", freed"
        return (
            f"Tensor(shape={self._shape}, dtype={self._dtype.value}, device={self._device},"
            f" backend={self._backend.name!r}{state})"
        )

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    # -- transfers ------------------------------------------------------------------------------
    @property
    def _ops(self) -> TensorOps:
        """The backend's TensorOps, for the operators; a tensor whose backend was shut down is
        stale (StaleHandleError), as every other use of it says."""
        backend = self._backend
        if not backend.is_ready:
            raise StaleHandleError(_shut_down_message(self, "x"))
        return backend.tensor_ops

    async def to_host(self) -> np.ndarray[Any, Any]:
        """Wait for the operation that last wrote this tensor, then copy it into a new array.

        Awaiting never blocks the event loop; cancelling the wait leaves the tensor intact.
        """
        return await self._backend.memory_manager.read_tensor(self)

    def numpy(self) -> np.ndarray[Any, Any]:
        """Blocking twin of :meth:`to_host` for scripts (blocks the calling thread)."""
        return self._backend.memory_manager.read_tensor_blocking(self)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        return self._backend.memory_manager.export_dlpack(self, stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._backend.memory_manager.dlpack_device(self)

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, other: Tensor | Scalar) -> Tensor:
        return self._ops.binary("add", self, other)

    def __radd__(self, other: Scalar) -> Tensor:
        return self._ops.binary("add", other, self)

    def __sub__(self, other: Tensor | Scalar) -> Tensor:
        return self._ops.binary("sub", self, other)

    def __rsub__(self, other: Scalar) -> Tensor:
        return self._ops.binary("sub", other, self)

    def __mul__(self, other: Tensor | Scalar) -> Tensor:
        return self._ops.binary("mul", self, other)

    def __rmul__(self, other: Scalar) -> Tensor:
        return self._ops.binary("mul", other, self)

    def __truediv__(self, other: Tensor | Scalar) -> Tensor:
        return self._ops.binary("div", self, other)

    def __rtruediv__(self, other: Scalar) -> Tensor:
        return self._ops.binary("div", other, self)

    def __matmul__(self, other: Tensor) -> Tensor:
        return self._ops.matmul(self, other)

    def __neg__(self) -> Tensor:
        return self._ops.unary("neg", self)

    def __pow__(self, other: Tensor | Scalar) -> Tensor:
        return self._ops.binary("pow", self, other)

    __hash__ = object.__hash__


def _shut_down_message(t: Tensor, name: str) -> str:
    return (
        f"{name} belongs to backend {t._backend.name!r} on {t._device}, which was shut down"
        " (or failed): a tensor does not outlive its backend's session"
    )
