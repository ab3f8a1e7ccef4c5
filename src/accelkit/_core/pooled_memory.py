"""What every pooled memory manager shares: allocation with validated arguments, handle checks,
statistics and pool settings. A backend adds its transfers and its stream-ordered ``free``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelkit._core.pool import CachingPool
from accelkit._core.validation import check_int, check_tensor
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.errors import InvalidArgumentError, StaleHandleError
from accelkit.memory import MemoryInfo, MemoryPoolConfig
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = ["PooledMemoryManager"]


class PooledMemoryManager(DeviceMemoryManager):
    """A :class:`DeviceMemoryManager` over a :class:`CachingPool` (see the module docstring)."""

    def __init__(self, backend: ComputeBackend, pool: CachingPool) -> None:
        self._backend = backend
        self.pool = pool

    def _settle(self) -> None:
        """Return blocks whose last use has completed, before statistics are read (a backend
        that defers frees until its device work finishes overrides this)."""

    def allocate(self, nbytes: int, alignment: int | None = None) -> DeviceBuffer:
        self._backend._require_ready()
        n = check_int(nbytes, "nbytes", minimum=0)
        if alignment is not None:
            a = check_int(alignment, "alignment", minimum=1)
            if a & (a - 1) or a > self.pool.config.alignment:
                raise InvalidArgumentError(
                    f"alignment must be a power of two up to {self.pool.config.alignment}; got {a}"
                )
        return self.pool.allocate(n)

    def _buffer(self, obj: DeviceBuffer | Tensor, name: str) -> DeviceBuffer:
        """The live buffer of this pool behind ``obj`` (a buffer or a tensor)."""
        if isinstance(obj, Tensor):
            check_tensor(self._backend, obj, name)
            return obj._buffer
        if not isinstance(obj, DeviceBuffer):
            raise InvalidArgumentError(
                f"{name} must be a DeviceBuffer or a Tensor; got {type(obj).__name__}"
            )
        if obj._pool is not self.pool or not obj.is_alive:
            raise StaleHandleError(f"{name} {obj!r} was freed or belongs to another backend")
        return obj

    def memory_info(self) -> MemoryInfo:
        self._settle()
        return self.pool.info()

    def configure_pool(self, config: MemoryPoolConfig) -> None:
        self.pool.configure(config)

    def trim(self) -> int:
        self._settle()
        return self.pool.trim()

    def reset_peak(self) -> None:
        self._settle()
        self.pool.reset_peak()
