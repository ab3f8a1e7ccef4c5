"""The example backend's memory kernels: a caching pool of untyped host blocks.

``backend.memory_manager`` is the core's: it checks every argument (live buffers and tensors of
this backend, sizes, the host array), keeps the statistics and the pool settings, and waits for
the writers of what is read. This class gives the pool and says how the device's memory is
reached: blocks are flat ``uint8`` arrays, and every copy is ordered with the streams' work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit import Tensor
from accelkit.device import Device
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import CachingPool, DeviceBuffer, MemoryKernels, buffer_of
from accelkit.sdk import host as h
from accelkit_example.probe import MEMORY
from accelkit_example.submit import Array, ExampleComponent, array

if TYPE_CHECKING:
    from accelkit_example.backend import ExampleBackend


class ExampleMemoryKernels(MemoryKernels):
    backend: ExampleBackend

    def __init__(self, backend: ExampleBackend, device: Device, config: MemoryPoolConfig) -> None:
        alloc = h.aligned_allocator(config.alignment)
        super().__init__(backend, CachingPool(device, alloc, h.release_block, MEMORY, config))
        #: Copies run in stream order, as kernels do.
        self._copies = ExampleComponent(backend)

    def free(self, buffer: DeviceBuffer) -> None:
        # Stream-ordered: the block returns to the pool after the work submitted so far on every
        # stream (any of them may still read it, and the pool may hand it to any of them next).
        backend = self.backend
        h.free_in_stream_order(self.pool, buffer, backend.current_stream, backend.streams)

    async def write(self, buffer: DeviceBuffer, data: Array, dst: Tensor | None) -> None:
        # ``data`` is the core's snapshot of the caller's bytes (MemoryKernels.stage).
        def run() -> None:
            buffer.handle[: data.size] = data

        tensors = (dst,) if dst is not None else ()
        self._copies.launch(run, tensors, tensors)
        await self.backend.current_stream.synchronize()

    async def read(self, out: Array, buffer: DeviceBuffer, src: Tensor | None) -> None:
        # The core has waited for the writers and the current stream's work. A free meanwhile
        # waits for the copy (it reads ``buffer``).
        await h.copy_into(out, buffer.handle[: out.nbytes], buffer)

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

        self._copies.launch(
            run,
            [src_tensor] if src_tensor is not None else [],
            [dst_tensor] if dst_tensor is not None else [],
        )

    # -- tensor transfers: the core has waited for the tensor's writers ---------------------------
    async def read_tensor(self, tensor: Tensor) -> Array:
        # Large copies run off the event loop; a free meanwhile waits for them.
        return await h.copy_to_host(array(tensor), buffer_of(tensor))

    def read_tensor_blocking(self, tensor: Tensor) -> Array:
        return np.array(array(tensor), copy=True)

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        # The exported array holds the block: the pool does not reuse it while it is read.
        return h.export_dlpack(buffer_of(tensor), array(tensor), **kwargs)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: the host can read this device's memory
