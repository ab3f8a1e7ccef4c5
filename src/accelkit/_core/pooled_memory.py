"""What every pooled memory manager shares: allocation with validated arguments, handle checks,
statistics and pool settings. A backend adds its transfers and its stream-ordered ``free``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.pool import CachingPool
from accelkit._core.validation import check_int, check_tensor
from accelkit.abc.memory import DeviceBuffer, DeviceMemoryManager
from accelkit.errors import InvalidArgumentError, StaleHandleError
from accelkit.memory import MemoryInfo, MemoryPoolConfig
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.stream_backend import StreamBackend

__all__ = ["PooledMemoryManager"]


class PooledMemoryManager(DeviceMemoryManager):
    """A :class:`DeviceMemoryManager` over a :class:`CachingPool` (see the module docstring)."""

    def __init__(self, backend: StreamBackend[Any], pool: CachingPool) -> None:
        self.backend = backend  # type: ignore[misc]  # a plain attribute at run time
        self.pool = pool

    if TYPE_CHECKING:
        # Read-only to the type checker, so that a backend's memory manager may narrow it to
        # its own backend class (``backend: MyBackend``).
        @property
        def backend(self) -> StreamBackend[Any]: ...

    def _settle(self) -> None:
        """Return blocks whose last use has completed, before statistics are read (a backend
        that defers frees until its device work finishes overrides this)."""

    def allocate(self, nbytes: int, alignment: int | None = None) -> DeviceBuffer:
        self.backend.check_ready()
        n = check_int(nbytes, "nbytes", minimum=0)
        if alignment is not None:
            a = check_int(alignment, "alignment", minimum=1)
            if a & (a - 1) or a > self.pool.config.alignment:
                raise InvalidArgumentError(
                    f"alignment must be a power of two up to {self.pool.config.alignment}; got {a}"
                )
        return self.pool.allocate(n)

    def owned_buffer(self, obj: DeviceBuffer | Tensor, name: str) -> DeviceBuffer:
        """The live buffer of this pool behind ``obj`` (a buffer or a tensor): StaleHandleError
        for a freed buffer or another backend's, InvalidArgumentError naming ``name`` for a
        wrong type. Transfers and kernel launchers check their arguments with it."""
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

    # -- argument checks of the transfers (the same on every backend) -------------------------------
    def check_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> tuple[DeviceBuffer, memoryview]:
        """``copy_htod``'s checked arguments: the destination buffer and the source's bytes."""
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
        return buf, view

    def check_dtoh(self, dst: Any, src: DeviceBuffer | Tensor) -> DeviceBuffer:
        """``copy_dtoh``'s checked arguments: the source buffer (``dst`` is a host array)."""
        buf = self.owned_buffer(src, "src")
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise InvalidArgumentError("copy_dtoh: dst must be a writable C-contiguous NumPy array")
        if dst.nbytes > buf.nbytes:
            raise InvalidArgumentError(
                f"copy_dtoh: dst has {dst.nbytes} bytes, src only {buf.nbytes}"
            )
        return buf

    def check_dtod(
        self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor
    ) -> tuple[DeviceBuffer, DeviceBuffer]:
        """``copy_dtod``'s checked arguments."""
        d, s = self.owned_buffer(dst, "dst"), self.owned_buffer(src, "src")
        if s.nbytes > d.nbytes:
            raise InvalidArgumentError(f"copy_dtod: src has {s.nbytes} bytes, dst only {d.nbytes}")
        return d, s

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
