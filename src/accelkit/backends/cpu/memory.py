"""The CPU backend's memory manager: host memory from a caching pool, with exact accounting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.host_memory import (
    aligned_allocator,
    copy_into,
    copy_to_host,
    export_dlpack,
    free_in_stream_order,
    release_block,
)
from accelkit._core.host_stream import HostStream
from accelkit._core.pool import CachingPool
from accelkit._core.pooled_memory import PooledMemoryManager
from accelkit._core.validation import check_tensor
from accelkit.abc.memory import DeviceBuffer
from accelkit.backends.cpu.probe import system_memory_bytes
from accelkit.backends.cpu.submit import CPUComponent
from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk.tensors import pending_writes
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.backends.cpu.backend import CPUBackend

__all__ = ["CPUMemoryManager", "system_memory_bytes"]


class CPUMemoryManager(PooledMemoryManager):
    def __init__(self, backend: CPUBackend, device: Device, config: MemoryPoolConfig) -> None:
        alloc = aligned_allocator(config.alignment)
        pool = CachingPool(device, alloc, release_block, system_memory_bytes(), config)
        super().__init__(backend, pool)
        #: Submits the copies in stream order, as the kernels do.
        self._copies = CPUComponent(backend)

    # -- buffers ----------------------------------------------------------------------------------

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        stream: HostStream = self.backend.current_stream
        free_in_stream_order(self.pool, self.owned_buffer(buffer, "buffer"), stream)

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self.check_htod(dst, src)
        data = await copy_to_host(np.frombuffer(view, np.uint8))  # the snapshot, off-loop if large
        if isinstance(dst, Tensor):
            await dst._stream.synchronize()
        self._copies.launch(
            lambda: buf.handle[: data.size].__setitem__(slice(None), data), (), (), cost=data.size
        )
        await self.backend.current_stream.synchronize()

    async def copy_dtoh(self, dst: np.ndarray[Any, Any], src: DeviceBuffer | Tensor) -> None:
        buf = self.check_dtoh(dst, src)
        if isinstance(src, Tensor):
            for stream, seq in pending_writes(src):
                await stream.wait_for(seq)
        elif buf.last_write is not None:
            await buf.last_write[0].wait_for(buf.last_write[1])
        await self.backend.current_stream.synchronize()
        await copy_into(dst.reshape(-1).view(np.uint8), buf.handle[: dst.nbytes])

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self.check_dtod(dst, src)
        n = s.nbytes
        inputs = [src] if isinstance(src, Tensor) else []
        outputs = [dst] if isinstance(dst, Tensor) else []

        def run() -> None:
            d.handle[:n] = s.handle[:n]

        self._copies.launch(run, inputs, outputs, cost=n)

    # -- tensor transfers -------------------------------------------------------------------------
    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        check_tensor(self.backend, tensor, "tensor")
        # The tensor's writer, and the last write to its memory through another view.
        for stream, seq in pending_writes(tensor):
            await stream.wait_for(seq)
        return await copy_to_host(tensor._data)

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        check_tensor(self.backend, tensor, "tensor")
        for stream, seq in pending_writes(tensor):
            stream.wait_for_blocking(seq)
        return np.array(tensor._data, copy=True)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        check_tensor(self.backend, tensor, "tensor")
        for s, seq in pending_writes(tensor):
            s.wait_for_blocking(seq)
        return export_dlpack(tensor._buffer, tensor._data, **kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        return (1, 0)  # kDLCPU
