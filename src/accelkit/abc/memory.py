"""Device memory: buffers, and the manager that allocates, accounts for and transfers them.

Ownership: a :class:`DeviceBuffer` is owned by the memory manager that allocated it. Tensors hold a
reference to their buffer; when the last reference goes away the buffer's memory returns to the
manager's pool (in stream order: after the last operation that wrote it). ``free`` returns it
earlier and makes every tensor on it raise :class:`~accelkit.errors.StaleHandleError`.
Statistics are exact: ``memory_info().used`` is the sum of the requested sizes of live buffers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit.device import Device
from accelkit.memory import MemoryInfo, MemoryPoolConfig, MemoryPressure

if TYPE_CHECKING:
    from accelkit._core.pool import CachingPool
    from accelkit.tensor import Tensor

__all__ = ["DeviceBuffer", "DeviceMemoryManager"]


class DeviceBuffer:
    """A block of device memory from a backend's pool.

    ``handle`` is the backend's own object (a NumPy array on the CPU, a ``cl.Buffer``, a CuPy
    memory pointer...). ``nbytes`` is the requested size; ``block_size`` the size class it occupies.
    """

    __slots__ = (
        "__weakref__", "_gen", "_pool", "block_size", "device", "handle", "last_write", "nbytes",
    )  # fmt: skip

    def __init__(
        self,
        pool: CachingPool,
        handle: Any,
        nbytes: int,
        block_size: int,
        device: Device,
        gen: int,
    ) -> None:
        self._pool: CachingPool | None = pool
        self._gen = gen
        self.handle = handle
        self.nbytes = nbytes
        self.block_size = block_size
        self.device = device
        #: ``(stream, seq)`` of the last operation submitted that writes this memory, through
        #: any tensor over it (views share the buffer), or None. A read of any view waits for
        #: it as well as for its own tensor's writer (:func:`accelkit.sdk.mark_written` sets it).
        self.last_write: tuple[Any, int] | None = None

    @property
    def is_alive(self) -> bool:
        """False after ``free``, after the backend's shutdown, or after a context rebuild."""
        pool = self._pool
        return pool is not None and pool.generation == self._gen

    def __del__(self) -> None:
        try:
            pool = self._pool
        except AttributeError:  # interrupted (Ctrl-C) before __init__ set it: nothing to give
            return
        if pool is not None and not pool.closed:
            # CachingPool.release_later, inlined (every tensor's death comes here): an append to
            # a deque, atomic in CPython, drained under the pool's lock at its next allocation.
            # A closed pool (its backend shut down) drains nothing again: the block goes with
            # the buffer.
            pool._released.append(self)

    def __repr__(self) -> str:
        state = "live" if self.is_alive else "freed"
        return f"DeviceBuffer(nbytes={self.nbytes}, device={self.device}, {state})"


class DeviceMemoryManager(ABC):
    """Allocates device memory from a caching pool, accounts for it, and moves data.

    Host transfers are coroutines: they wait (without blocking the loop) for the operations that
    last wrote the source, then copy.
    """

    @abstractmethod
    def allocate(self, nbytes: int, alignment: int | None = None) -> DeviceBuffer:
        """Reserve ``nbytes`` bytes. Raises ``OutOfMemoryError`` past the limit or the device."""

    @abstractmethod
    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        """Return the memory now (stream-ordered); later use of the buffer raises StaleHandleError.

        Stream-ordered: the block goes back to the pool once the work submitted so far, which
        may still read or write it (a ``to_host`` copying it included), is done. It is the
        caller saying nothing else reads the memory: an array exported through DLPack
        (``np.from_dlpack(t)``) views the block, and after a free it may show another tensor's
        data (drop the tensor instead, and the exported array keeps the block).

        Freeing a buffer twice raises StaleHandleError.
        """

    @abstractmethod
    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        """Copy a host buffer (anything with the buffer protocol) into device memory."""

    @abstractmethod
    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        """Copy device memory into a writable, C-contiguous host array of the same byte size."""

    @abstractmethod
    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        """Submit a device-to-device copy of ``src.nbytes`` bytes (a submission; returns at once)."""

    @abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Exact statistics, as of every operation submitted so far."""

    @property
    def pressure(self) -> MemoryPressure:
        """How close ``used`` is to ``total``."""
        info = self.memory_info()
        return MemoryPressure.from_fraction(info.used / info.total if info.total else 0.0)

    @abstractmethod
    def configure_pool(self, config: MemoryPoolConfig) -> None:
        """Change the pool's settings (a lower limit takes effect for new allocations)."""

    @abstractmethod
    def trim(self) -> int:
        """Release cached free blocks to the device; returns the bytes released."""

    @abstractmethod
    def reset_peak(self) -> None:
        """Start measuring ``peak`` afresh from the current ``used``."""

    # Transfers of whole tensors, used by Tensor.to_host / numpy / __dlpack__.
    @abstractmethod
    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        """A new host array with the tensor's elements, once its last writer completed."""

    @abstractmethod
    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        """Blocking twin of :meth:`read_tensor`."""

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        from accelkit.errors import UnsupportedOperationError

        raise UnsupportedOperationError(f"{tensor.backend.name} tensors do not export DLPack")

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        from accelkit.errors import UnsupportedOperationError

        raise UnsupportedOperationError(f"{tensor.backend.name} tensors do not export DLPack")
