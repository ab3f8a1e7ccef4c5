"""Memory helpers for backends whose device memory is host memory (the CPU backend, the example
backend): aligned blocks for the caching pool, stream-ordered frees on a host stream, and
DLPack export that keeps the block alive."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit.abc.memory import DeviceBuffer

if TYPE_CHECKING:
    from accelkit._core.host_stream import HostStream
    from accelkit._core.pool import CachingPool

__all__ = ["aligned_allocator", "export_dlpack", "free_in_stream_order", "release_block"]

Array = np.ndarray[Any, Any]


def aligned_allocator(alignment: int) -> Callable[[int], Array]:
    """A pool ``raw_alloc``: flat ``uint8`` blocks whose first byte is ``alignment``-aligned."""

    def alloc(size: int) -> Array:
        raw = np.empty(size + alignment, np.uint8)
        offset = (-raw.ctypes.data) % alignment
        return raw[offset : offset + size]

    return alloc


def release_block(handle: Any) -> None:
    """A pool ``raw_free`` for host blocks: the memory goes back to the allocator when the last
    reference to the array is dropped."""


def free_in_stream_order(pool: CachingPool, buffer: DeviceBuffer, stream: HostStream) -> None:
    """Free ``buffer`` now (stale and uncounted at once); its block returns to the pool after the
    work submitted so far on ``stream``, which may still use it."""
    if stream.query():
        pool.free(buffer)
        return

    def recycle_later(recycle: Callable[[], None]) -> None:
        stream.submit(recycle, heavy=True)

    pool.free(buffer, recycle_later)


def export_dlpack(buffer: DeviceBuffer, array: Array, **kwargs: Any) -> Any:
    """``array.__dlpack__(**kwargs)`` through a holder whose lifetime keeps ``buffer`` (and so
    its block) out of the pool while the consumer still reads it."""
    return np.asarray(_Holder(buffer, array)).__dlpack__(**kwargs)


class _Holder:
    __slots__ = ("__array_interface__", "buffer", "data")

    def __init__(self, buffer: DeviceBuffer, data: Array) -> None:
        self.buffer = buffer
        self.data = data
        self.__array_interface__ = data.__array_interface__
