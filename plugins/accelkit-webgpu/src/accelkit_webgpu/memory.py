"""The WebGPU backend's memory kernels: a caching pool of ``wgpu.GPUBuffer`` blocks.

Blocks are created lazily by the thread that first records work on them (see
:class:`~accelkit_webgpu.gpu.Block`), so allocating never calls wgpu on the event loop's
thread. Transfers are ordered with the streams' work: a read (after the core's memory manager has
checked its arguments and waited for the tensor's writers) maps the buffer on a worker thread; a
write is recorded on the current stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from accelkit import Tensor
from accelkit.device import Device
from accelkit.errors import UnsupportedOperationError
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import CachingPool, DeviceBuffer, MemoryKernels, buffer_of
from accelkit.sdk import host as h
from accelkit_webgpu.gpu import GPU, Block
from accelkit_webgpu.submit import block, nbytes

if TYPE_CHECKING:
    from accelkit_webgpu.backend import WebGPUBackend

__all__ = ["WebGPUMemoryKernels"]

#: Reads of at least this many bytes copy off the event loop's thread (as the host backends do).
_OFF_LOOP = h.OFF_LOOP_COPY_BYTES


class WebGPUMemoryKernels(MemoryKernels):
    backend: WebGPUBackend

    def __init__(
        self, backend: WebGPUBackend, device: Device, gpu: GPU, total: int, config: MemoryPoolConfig
    ) -> None:
        def alloc(size: int) -> Block:
            if size > gpu.max_buffer:
                raise MemoryError(f"{size} bytes is over the adapter's maxBufferSize")
            return Block(gpu, size)

        super().__init__(backend, CachingPool(device, alloc, Block.release, total, config))
        self._gpu = gpu

    def _launch(
        self, fn: Callable[[], None], inputs: Sequence[Any], outputs: Sequence[Any]
    ) -> None:
        """Ordered with the streams' work, as a kernel's launch."""
        self.backend.tensor_kernels.launch(fn, inputs, outputs)

    def free(self, buffer: DeviceBuffer) -> None:
        # Stream-ordered: the block returns to the pool after the work submitted so far on every
        # stream (any of them may still read it, and the pool may hand it to any of them next).
        backend = self.backend
        h.free_in_stream_order(self.pool, buffer, backend.current_stream, backend.streams)

    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        # ``data`` is the core's snapshot of the caller's bytes (MemoryKernels.stage).
        gpu, target = self._gpu, buffer.handle
        tensors = (dst,) if dst is not None else ()
        self._launch(lambda: gpu.write(target, data), tensors, tensors)
        await self.backend.current_stream.synchronize()

    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        # The core has waited for the writers and the current stream's work. Mapping waits for
        # the device: on a worker thread, never on the loop's.
        gpu, handle, n = self._gpu, buffer.handle, out.nbytes
        with h.reading(buffer):  # a free meanwhile keeps the block until the read is done
            out[:] = await anyio.to_thread.run_sync(lambda: gpu.read(handle, n))

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        gpu = self._gpu
        self._launch(
            lambda: gpu.copy(dst.handle, src.handle, nbytes),
            [src_tensor] if src_tensor is not None else [],
            [dst_tensor] if dst_tensor is not None else [],
        )

    # -- tensor transfers: the core has waited for the tensor's writers ---------------------------
    def _typed(self, tensor: Tensor, raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return raw.view(tensor.dtype.to_numpy()).reshape(tensor.shape)

    async def read_tensor(self, tensor: Tensor) -> Any:
        gpu, handle, n = self._gpu, block(tensor), nbytes(tensor)
        # Mapping waits for the device: always on a worker thread, never on the loop's.
        # (wgpu-py's read_buffer returns a fresh copy of the mapped range: no second copy)
        # (a free meanwhile keeps the block until the read is done: it returned the data of
        # the tensor the block went to next)
        with h.reading(buffer_of(tensor)):
            raw = await anyio.to_thread.run_sync(lambda: gpu.read(handle, n))
        return self._typed(tensor, raw)

    def read_tensor_blocking(self, tensor: Tensor) -> Any:
        return self._typed(tensor, self._gpu.read(block(tensor), nbytes(tensor)))

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        raise UnsupportedOperationError(
            "webgpu tensors cannot be exported through DLPack (WebGPU has no DLPack device);"
            " read them with await tensor.to_host()"
        )

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        raise UnsupportedOperationError("webgpu tensors have no DLPack device")
