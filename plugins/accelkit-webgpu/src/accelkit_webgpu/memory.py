"""The WebGPU backend's memory manager: a caching pool of ``wgpu.GPUBuffer`` blocks.

Blocks are created lazily by the thread that first records work on them (see
:class:`~accelkit_webgpu.gpu.Block`), so allocating never calls wgpu on the event loop's
thread. Transfers are ordered with the streams' work: a read waits for the tensor's writers, then
maps the buffer on a worker thread; a write is recorded on the current stream.
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
from accelkit.sdk import (
    CachingPool,
    DeviceBuffer,
    HostStream,
    PooledMemoryManager,
    PositionStream,
    check_tensor,
    pending_writes,
)
from accelkit.sdk import host as h
from accelkit_webgpu.gpu import GPU, Block
from accelkit_webgpu.submit import block, nbytes

if TYPE_CHECKING:
    from accelkit_webgpu.backend import WebGPUBackend

__all__ = ["WebGPUMemoryManager"]

#: Reads of at least this many bytes copy off the event loop's thread (as the host backends do).
_OFF_LOOP = h.OFF_LOOP_COPY_BYTES


class WebGPUMemoryManager(PooledMemoryManager):
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

    def _stream(self) -> HostStream:
        return self.backend.current_stream

    def _launch(
        self, fn: Callable[[], None], inputs: Sequence[Any], outputs: Sequence[Any]
    ) -> None:
        """Ordered with the streams' work, as a kernel's launch."""
        self.backend.tensor_kernels.launch(fn, inputs, outputs)

    def free(self, buffer: DeviceBuffer | Tensor) -> None:
        # Stream-ordered: the block returns to the pool after the work submitted so far.
        h.free_in_stream_order(self.pool, self.owned_buffer(buffer, "buffer"), self._stream())

    async def copy_htod(self, dst: DeviceBuffer | Tensor, src: Any) -> None:
        buf, view = self.check_htod(dst, src)
        data = np.array(np.frombuffer(view, np.uint8), copy=True)  # a snapshot
        gpu, target = self._gpu, buf.handle
        is_tensor = isinstance(dst, Tensor)
        self._launch(
            lambda: gpu.write(target, data),
            (dst,) if is_tensor else (),
            (dst,) if is_tensor else (),
        )
        await self._stream().synchronize()

    async def copy_dtoh(self, dst: Any, src: DeviceBuffer | Tensor) -> None:
        buf = self.check_dtoh(dst, src)
        if isinstance(src, Tensor):
            for stream, seq in self._pending(src):
                await stream.wait_for(seq)
        await self._stream().synchronize()
        gpu, handle, n = self._gpu, buf.handle, dst.nbytes
        data = await anyio.to_thread.run_sync(lambda: gpu.read(handle, n))
        dst.reshape(-1).view(np.uint8)[:] = data

    def copy_dtod(self, dst: DeviceBuffer | Tensor, src: DeviceBuffer | Tensor) -> None:
        d, s = self.check_dtod(dst, src)
        gpu, n = self._gpu, s.nbytes
        self._launch(
            lambda: gpu.copy(d.handle, s.handle, n),
            [src] if isinstance(src, Tensor) else [],
            [dst] if isinstance(dst, Tensor) else [],
        )

    # -- tensor transfers -------------------------------------------------------------------------
    def _pending(self, tensor: Tensor) -> list[tuple[PositionStream, int]]:
        check_tensor(self.backend, tensor, "tensor")
        return pending_writes(tensor)

    def _typed(self, tensor: Tensor, raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return raw.view(tensor.dtype.to_numpy()).reshape(tensor.shape)

    async def read_tensor(self, tensor: Tensor) -> Any:
        for stream, seq in self._pending(tensor):
            await stream.wait_for(seq)
        gpu, handle, n = self._gpu, block(tensor), nbytes(tensor)
        # Mapping waits for the device: always on a worker thread, never on the loop's.
        # (wgpu-py's read_buffer returns a fresh copy of the mapped range: no second copy)
        raw = await anyio.to_thread.run_sync(lambda: gpu.read(handle, n))
        return self._typed(tensor, raw)

    def read_tensor_blocking(self, tensor: Tensor) -> Any:
        for stream, seq in self._pending(tensor):
            stream.wait_for_blocking(seq)
        return self._typed(tensor, self._gpu.read(block(tensor), nbytes(tensor)))

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        raise UnsupportedOperationError(
            "webgpu tensors cannot be exported through DLPack (WebGPU has no DLPack device);"
            " read them with await tensor.to_host()"
        )

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        raise UnsupportedOperationError("webgpu tensors have no DLPack device")
