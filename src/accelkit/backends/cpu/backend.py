"""``CPUBackend``: the embedded backend on NumPy, always available.

Work runs on host streams (:mod:`accelkit._core.host_stream`): large operations on each stream's
worker thread, so the event loop stays free (NumPy releases the GIL in its loops and in BLAS),
small ones inline when the stream is idle, because the hand-off would cost more than the work.
"""

from __future__ import annotations

from typing import Any

import anyio

from accelkit import __version__
from accelkit._core.host_stream import HostStream
from accelkit.abc.backend import ComputeBackend
from accelkit.abc.stream import Stream
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.memory import MemoryPoolConfig

__all__ = ["CPUBackend"]


class CPUBackend(ComputeBackend):
    """NumPy on the host CPU (device ``cpu:0``)."""

    name = "cpu"
    version = __version__
    device_kinds = frozenset({"cpu"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__()
        self._pool_config = pool_config or MemoryPoolConfig()
        self._streams: list[HostStream] = []
        self._default: HostStream | None = None
        self._device_obj = Device("cpu", 0)

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        return d.kind == "cpu" and d.index == 0

    @property
    def capabilities(self) -> BackendCapabilities:
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
        self._default = HostStream(device, "cpu:0/default")
        self._streams = [self._default]
        self._memory_manager = CPUMemoryManager(self, device, self._pool_config)
        self._pool = self._memory_manager.pool
        self.install_kernels(CPUTensorKernels(self), CPUFactoryKernels(self), CPUFusedKernels(self))
        self._kernel_executor = None

    async def _synchronize(self) -> None:
        for stream in list(self._streams):
            await stream.synchronize()

    async def _shutdown(self) -> None:
        try:
            with anyio.CancelScope(shield=True):
                for stream in list(self._streams):
                    stream_done = stream.submitted
                    await stream.wait_for_quietly(stream_done)
                    await anyio.to_thread.run_sync(stream.close)
        finally:
            self._pool.invalidate_all(close=True)
            self._streams = []

    # -- streams ----------------------------------------------------------------------------------
    @property
    def _default_stream(self) -> HostStream:
        assert self._default is not None
        return self._default

    @property
    def default_stream(self) -> Stream:
        self._require_ready()
        return self._default_stream

    def create_stream(self) -> HostStream:
        self._require_ready()
        stream = HostStream(self._device_obj, f"cpu:0/stream{len(self._streams)}")
        self._streams.append(stream)
        return stream

    def _check_stream(self, stream: Stream) -> None:
        if stream not in self._streams:
            raise InvalidArgumentError(f"{stream!r} is not a stream of this {self.name} backend")

    def _pending_operations(self) -> int:
        return sum(s.submitted - s.completed for s in self._streams)

    def _completed_operations(self) -> int:
        return sum(s.completed for s in self._streams)

    def _generation(self) -> int:
        pool: Any = getattr(self, "_pool", None)
        return pool.generation if pool is not None else 0
