"""The example backend's memory manager: a caching pool of untyped host blocks.

:class:`accelkit.sdk.PooledMemoryManager` gives allocation, statistics, pool configuration and the
argument checks of every transfer; this class says how the device's memory is reached: blocks are
flat ``uint8`` arrays, and every transfer is ordered with the streams' work.
"""

from __future__ import annotations

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
    PositionStream,
    buffer_of,
    check_tensor,
    pending_writes,
)
from accelkit.sdk import host as h
from accelkit_example.probe import MEMORY
from accelkit_example.submit import Array, ExampleComponent, array

if TYPE_CHECKING:
    from accelkit_example.backend import ExampleBackend


class ExampleMemoryManager(PooledMemoryManager):
    def __init__(self, backend: ExampleBackend, device: Device, config: MemoryPoolConfig) -> None:
        alloc = h.aligned_allocator(config.alignment)
        super().__init__(backend, CachingPool(device, alloc, h.release_block, MEMORY, config))
        self._example = backend
        #: Copies run in stream order, as kernels do.
        self._copies = ExampleComponent(backend)

    def _stream(self) -> HostStream:
        return self._example.current_stream

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        # Stream-ordered: the block returns to the pool after the work submitted so far.
        h.free_in_stream_order(self.pool, self.owned_buffer(buffer, "buffer"), self._stream())

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self.check_htod(dst, src)
        data = await h.copy_to_host(np.frombuffer(view, np.uint8))  # a snapshot, off-loop if large

        def run() -> None:
            buf.handle[: data.size] = data

        tensors = (dst,) if isinstance(dst, Tensor) else ()
        self._copies.launch(run, tensors, tensors)
        await self._stream().synchronize()

    async def copy_dtoh(self, dst: Array, src: DeviceBuffer | Tensor) -> None:
        buf = self.check_dtoh(dst, src)
        if isinstance(src, Tensor):
            for stream, seq in self._pending(src):
                await stream.wait_for(seq)
        await self._stream().synchronize()
        await h.copy_into(dst.reshape(-1).view(np.uint8), buf.handle[: dst.nbytes])

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self.check_dtod(dst, src)
        n = s.nbytes

        def run() -> None:
            d.handle[:n] = s.handle[:n]

        self._copies.launch(
            run, [src] if isinstance(src, Tensor) else [], [dst] if isinstance(dst, Tensor) else []
        )

    # -- tensor transfers -------------------------------------------------------------------------
    def _pending(self, tensor: Tensor) -> list[tuple[PositionStream, int]]:
        """What a read of ``tensor`` waits for: its writer, and the last write to its memory
        through another view of the same buffer (a copy into the base of a reshaped view)."""
        check_tensor(self._example, tensor, "tensor")
        return pending_writes(tensor)

    async def read_tensor(self, tensor: Tensor) -> Array:
        for stream, seq in self._pending(tensor):
            await stream.wait_for(seq)
        return await h.copy_to_host(array(tensor))  # large copies run off the event loop

    def read_tensor_blocking(self, tensor: Tensor) -> Array:
        for stream, seq in self._pending(tensor):
            stream.wait_for_blocking(seq)
        return np.array(array(tensor), copy=True)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        for s, seq in self._pending(tensor):
            s.wait_for_blocking(seq)
        # The exported array holds the block: the pool does not reuse it while it is read.
        return h.export_dlpack(buffer_of(tensor), array(tensor), **kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: the host can read this device's memory
