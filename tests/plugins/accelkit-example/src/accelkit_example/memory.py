"""The example backend's memory manager: a caching pool of untyped host blocks.

:class:`accelkit.sdk.PooledMemoryManager` gives allocation, statistics, pool configuration and the
argument checks of every transfer; this class says how the device's memory is reached: blocks are
flat ``uint8`` arrays, and every transfer is ordered with the streams' work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import (
    CachingPool,
    DeviceBuffer,
    HostStream,
    PooledMemoryManager,
    buffer_of,
    check_tensor,
    pending_writes,
)
from accelkit_example.probe import MEMORY
from accelkit_example.submit import Array, array

if TYPE_CHECKING:
    from accelkit_example.backend import ExampleBackend


def _allocator(alignment: int) -> Callable[[int], Array]:
    def alloc(size: int) -> Array:
        raw = np.empty(size + alignment, np.uint8)
        offset = (-raw.ctypes.data) % alignment
        return raw[offset : offset + size]

    return alloc


def _release(handle: Any) -> None:
    """A block's memory returns to the host allocator when its last reference goes."""


class ExampleMemoryManager(PooledMemoryManager):
    def __init__(self, backend: ExampleBackend, device: Device, config: MemoryPoolConfig) -> None:
        super().__init__(
            backend, CachingPool(device, _allocator(config.alignment), _release, MEMORY, config)
        )
        self._example = backend

    def _stream(self) -> HostStream:
        return self._example.current_stream  # type: ignore[return-value]

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        buf = self.owned_buffer(buffer, "buffer")
        # Stream-ordered: the block returns to the pool after the work submitted so far.
        stream = self._stream()
        if stream.query():
            self.pool.free(buf)
        else:

            def recycle_later(recycle: Callable[[], None]) -> None:
                stream.submit(recycle, heavy=True)

            self.pool.free(buf, recycle_later)

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self._host_source(dst, src)
        data = np.frombuffer(view, np.uint8).copy()

        def run() -> None:
            buf.handle[: data.size] = data

        is_tensor = isinstance(dst, Tensor)
        self._example.tensor_factory.kernels.launch(  # type: ignore[attr-defined]
            run, (dst,) if is_tensor else (), (dst,) if is_tensor else ()
        )
        await self._stream().synchronize()

    async def copy_dtoh(self, dst: Array, src: DeviceBuffer | Tensor) -> None:
        buf = self._host_destination(dst, src)
        if isinstance(src, Tensor):
            for stream, seq in self._pending(src):
                await stream.wait_for(seq)
        await self._stream().synchronize()
        dst.reshape(-1).view(np.uint8)[...] = buf.handle[: dst.nbytes]

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self._device_pair(dst, src)
        n = s.nbytes

        def run() -> None:
            d.handle[:n] = s.handle[:n]

        self._example.tensor_factory.kernels.launch(  # type: ignore[attr-defined]
            run,
            [src] if isinstance(src, Tensor) else [],
            [dst] if isinstance(dst, Tensor) else [],
        )

    # -- tensor transfers -------------------------------------------------------------------------
    def _pending(self, tensor: Tensor) -> list[tuple[HostStream, int]]:
        """What a read of ``tensor`` waits for: its writer, and the last write to its memory
        through another view of the same buffer (a copy into the base of a reshaped view)."""
        check_tensor(self._example, tensor, "tensor")
        return pending_writes(tensor)  # type: ignore[return-value]

    async def read_tensor(self, tensor: Tensor) -> Array:
        for stream, seq in self._pending(tensor):
            await stream.wait_for(seq)
        return np.array(array(tensor), copy=True)

    def read_tensor_blocking(self, tensor: Tensor) -> Array:
        for stream, seq in self._pending(tensor):
            stream.wait_for_blocking(seq)
        return np.array(array(tensor), copy=True)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        for s, seq in self._pending(tensor):
            s.wait_for_blocking(seq)
        # The exported array's base holds the block, so the pool does not reuse it while the
        # consumer still reads it.
        return np.asarray(_Holder(buffer_of(tensor), array(tensor))).__dlpack__(**kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: the host can read this device's memory


class _Holder:
    __slots__ = ("__array_interface__", "buffer", "data")

    def __init__(self, buffer: DeviceBuffer, data: Array) -> None:
        self.buffer = buffer
        self.data = data
        self.__array_interface__ = data.__array_interface__
