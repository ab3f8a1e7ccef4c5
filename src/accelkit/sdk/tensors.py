"""The backend-facing side of :class:`~accelkit.tensor.Tensor`.

Users see a tensor's shape, dtype and device; a backend also needs its storage (the native
handle its kernels read: a NumPy array, a ``cl.Buffer``, a CuPy array), the pooled buffer that
owns the memory, and the stream position of its last writer. These functions are the supported
way to reach them; kernel code on a hot path may read the same fields through them once per
call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.positions import PositionStream
    from accelkit.abc.backend import ComputeBackend
    from accelkit.abc.memory import DeviceBuffer
    from accelkit.device import Device
    from accelkit.dtype import DType

__all__ = [
    "buffer_of", "last_writer", "mark_written", "new_tensor", "pending_writes", "storage",
    "view_of",
]  # fmt: skip


def new_tensor(
    backend: ComputeBackend,
    buffer: DeviceBuffer,
    storage: Any,
    shape: tuple[int, ...],
    dtype: DType,
    device: Device,
    stream: PositionStream,
    seq: int = 0,
) -> Tensor:
    """A tensor over ``buffer`` whose kernels read ``storage``; last written by ``stream`` at
    position ``seq`` (0: not yet written, or written by nothing pending)."""
    size = 1
    for d in shape:
        size *= d
    return Tensor(backend, buffer, storage, shape, dtype, device, size, stream, seq)


def view_of(x: Tensor, shape: tuple[int, ...], storage: Any = None) -> Tensor:
    """A tensor sharing ``x``'s buffer and last writer with another shape of the same size;
    ``storage`` replaces x's native handle where a backend's handle carries the shape (a
    reshaped NumPy array)."""
    return Tensor(
        x._backend, x._buffer, x._data if storage is None else storage, shape, x._dtype,
        x._device, x._size, x._stream, x._seq,
    )  # fmt: skip


def storage(x: Tensor) -> Any:
    """The native handle the backend's kernels read and write."""
    return x._data


def buffer_of(x: Tensor) -> DeviceBuffer:
    """The pooled buffer owning x's memory (shared by views)."""
    return x._buffer


def last_writer(x: Tensor) -> tuple[PositionStream, int]:
    """The stream and position of the operation that last wrote ``x`` (through ``x`` itself;
    see :func:`pending_writes` for a read, which must also see writes through other views)."""
    return x._stream, x._seq


def pending_writes(x: Tensor) -> list[tuple[PositionStream, int]]:
    """What a read of ``x``'s memory must wait for: its own last writer and the last write to
    its buffer through any view of it (the same entry once where they coincide)."""
    own = (x._stream, x._seq)
    shared = x._buffer.last_write
    if shared is None or shared == own:
        return [own]
    return [own, shared]


def mark_written(outputs: Iterable[Tensor], stream: PositionStream, seq: int) -> None:
    """Record that the operation at position ``seq`` of ``stream`` writes ``outputs``: every
    kernel calls this for its outputs when it enqueues, so that transfers and other streams
    wait for exactly that work."""
    write = (stream, seq)
    for o in outputs:
        o._stream = stream
        o._seq = seq
        o._buffer.last_write = write
