"""``CPUBackend``: the embedded backend on NumPy, always available.

Work runs on host streams (:mod:`accelkit._core.host_stream`): large operations on each stream's
worker thread, so the event loop stays free (NumPy releases the GIL in its loops and in BLAS),
small ones inline when the stream is idle, because the hand-off would cost more than the work.
"""

from __future__ import annotations

import anyio

from accelkit import __version__
from accelkit._core.host_stream import HostStream
from accelkit._core.stream_backend import StreamBackend
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.memory import MemoryPoolConfig

__all__ = ["CPUBackend"]


class CPUBackend(StreamBackend):
    """NumPy on the host CPU (device ``cpu:0``)."""

    name = "cpu"
    version = __version__
    device_kinds = frozenset({"cpu"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._streams: list[HostStream] = []
        self._default: HostStream | None = None
        self._device_obj = Device("cpu", 0)

    def _device_count(self) -> int:
        return 1

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        from accelkit.backends.cpu.probe import cpu_capabilities

        return cpu_capabilities()

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> None:
        from accelkit.backends.cpu.factory import CPUFactoryKernels
        from accelkit.backends.cpu.kernel_ops import CPUFusedKernels
        from accelkit.backends.cpu.memory import CPUMemoryManager
        from accelkit.backends.cpu.ops import CPUTensorKernels

        self.supported_dtypes = frozenset(DType)
        self._device_obj = device
        self._streams = []
        self._add_stream(HostStream(device, "cpu:0/default"))
        self._memory_manager = CPUMemoryManager(self, device, self._pool_config)
        self._pool = self._memory_manager.pool
        self.install_kernels(CPUTensorKernels(self), CPUFactoryKernels(self), CPUFusedKernels(self))
        self._kernel_executor = None

    async def _shutdown(self) -> None:
        try:
            with anyio.CancelScope(shield=True):
                for stream in list(self._streams):
                    stream_done = stream.submitted
                    await stream.wait_for_quietly(stream_done)
                    await anyio.to_thread.run_sync(stream.close)
        finally:
            self.pool.invalidate_all(close=True)
            self._streams = []

    # -- streams ----------------------------------------------------------------------------------
    def create_stream(self) -> HostStream:
        self._require_ready()
        stream = HostStream(self._device_obj, f"cpu:0/stream{len(self._streams)}")
        return self._add_stream(stream)  # type: ignore[no-any-return]
