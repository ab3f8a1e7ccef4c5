"""The CPU backend's memory kernels: host memory from a caching pool, copies in stream order.

``backend.memory_manager`` (the core's :class:`~accelkit.ops.MemoryManager`) checks every
argument and waits for the writers of what it reads; this says how the memory is reached."""

from __future__ import annotations

from collections.abc import Coroutine
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
from accelkit._core.pool import CachingPool
from accelkit.abc.memory import DeviceBuffer
from accelkit.backends.cpu.probe import system_memory_bytes
from accelkit.backends.cpu.submit import CPUComponent
from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk.kernels import MemoryKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.backends.cpu.backend import CPUBackend

__all__ = ["CPUMemoryKernels", "system_memory_bytes"]


class CPUMemoryKernels(MemoryKernels):
    backend: CPUBackend

    def __init__(self, backend: CPUBackend, device: Device, config: MemoryPoolConfig) -> None:
        alloc = aligned_allocator(config.alignment)
        pool = CachingPool(device, alloc, release_block, system_memory_bytes(), config)
        super().__init__(backend, pool)
        #: Submits the copies in stream order, as the kernels do.
        self._copies = CPUComponent(backend)

    def free(self, buffer: DeviceBuffer) -> None:
        backend = self.backend
        free_in_stream_order(self.pool, buffer, backend.current_stream, backend.streams)

    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        if dst is not None:
            await dst._stream.synchronize()
        self._copies.launch(
            lambda: buffer.handle[: data.size].__setitem__(slice(None), data),
            (),
            (),
            cost=data.size,
        )
        await self.backend.current_stream.synchronize()

    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        # The core waited for the writers and the current stream. A free meanwhile waits for
        # the copy (copy_into's buffer).
        await copy_into(out, buffer.handle[: out.nbytes], buffer)

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        def run() -> None:
            dst.handle[:nbytes] = src.handle[:nbytes]

        inputs = [src_tensor] if src_tensor is not None else []
        outputs = [dst_tensor] if dst_tensor is not None else []
        self._copies.launch(run, inputs, outputs, cost=nbytes)

    # -- tensor transfers: the core waited for the tensor's writers -------------------------------
    def read_tensor(self, tensor: Tensor) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        # The copy's coroutine itself, awaited by the core: no coroutine of its own around it
        # (reading a small tensor is common, and each layer costs).
        return copy_to_host(tensor._data, tensor._buffer)

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        return np.array(tensor._data, copy=True)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        return export_dlpack(tensor._buffer, tensor._data, **kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        return (1, 0)  # kDLCPU
