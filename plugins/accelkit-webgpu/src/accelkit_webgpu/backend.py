"""``WebGPUBackend``: one WebGPU adapter's device, its queue, and host-threaded streams.

Imported only when a user creates a ``webgpu`` backend; wgpu is imported here. Each accelkit
stream has a worker thread that records and submits the stream's commands to the device's one
queue (WebGPU has a single queue per device), so the event loop's thread never calls wgpu.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import anyio

from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import DeviceError
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import HostStream, Opened, StreamBackend
from accelkit_webgpu import __version__
from accelkit_webgpu.gpu import GPU
from accelkit_webgpu.probe import adapters, capabilities

if TYPE_CHECKING:
    from accelkit_webgpu.tensor_kernels import WebGPUTensorKernels

__all__ = ["WebGPUBackend"]

log = logging.getLogger("accelkit.webgpu")

#: Limits asked of the device: as much of each as the adapter has (WebGPU's defaults are lower).
_WANTED_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
)


class WebGPUBackend(StreamBackend[HostStream]):
    """A WebGPU adapter (``webgpu:N``, in the order wgpu-py enumerates them)."""

    name = "webgpu"
    version = __version__
    device_kinds = frozenset({"webgpu"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._gpu: GPU | None = None
        self._kernels: WebGPUTensorKernels | None = None
        #: When the device was recovered (monotonic seconds), for the failure rule of recover().
        self._recoveries: list[float] = []

    def _device_count(self) -> int:
        return len(adapters())

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        return capabilities(adapters()[index], index)

    @property
    def gpu(self) -> GPU:
        gpu = self._gpu
        if gpu is None:
            self.check_ready()
            raise DeviceError("the WebGPU device is not open")
        return gpu

    @property
    def tensor_kernels(self) -> WebGPUTensorKernels:
        """The backend's TensorKernels as their own class (``tensor_ops.kernels`` is typed as
        any backend's): the fused kernels, the memory manager and the variant checks use it.
        NotInitializedError unless the backend is ready, as ``tensor_ops``."""
        self.check_ready()
        kernels = self._kernels
        assert kernels is not None
        return kernels

    async def initialize(self, device: Device | str | None = None) -> None:
        await super().initialize(device)
        try:
            await self._verify_variants()
        except BaseException:
            # Failed or cancelled once the device was open and the backend ready: close what
            # was opened (the device, the stream's thread), then raise.
            with anyio.CancelScope(shield=True):
                await self.shutdown()
            raise

    async def _verify_variants(self) -> None:
        """Device-dependent kernel choices are verified by a run before they are used (the
        medium GEMM tile runs until then); the run's memory does not count in the peak."""
        await self.tensor_kernels.verify_large_tiles()
        self.memory_manager.reset_peak()

    @property
    def kernel_variants(self) -> dict[str, str]:
        """What each device-dependent choice runs, and why."""
        kernels = self.tensor_kernels
        if kernels.large_tiles:
            return {"gemm_tile": "large (verified)"}
        reason = kernels.large_tiles_reason or "not verified yet"
        return {"gemm_tile": f"medium ({reason})"}

    # -- a lost device ----------------------------------------------------------------------------
    @property
    def poisoned(self) -> bool:
        """Whether the device was lost (every call raises ContextPoisonedError until
        :meth:`recover`)."""
        return self._gpu is not None and self._gpu.lost is not None

    async def recover(self) -> None:
        """Open a new device after the old one was lost.

        Every tensor, buffer and kernel handle from before becomes stale (StaleHandleError: their
        memory went with the device); streams, the pool and the kernels are built anew
        (:meth:`reopen`). More than three recoveries within ten minutes mark the backend failed
        (DeviceError): a device that keeps getting lost needs a person.
        """
        self.check_ready()
        gpu = self._gpu
        if gpu is None or gpu.lost is None:
            return
        now = time.monotonic()
        self._recoveries = [t for t in self._recoveries if now - t < 600.0] + [now]
        if len(self._recoveries) > 3:
            reason = (
                f"{self.device} was lost {len(self._recoveries)} times in ten minutes; the"
                " backend is marked failed: shut it down"
            )
            self.mark_failed(reason)
            raise DeviceError(reason)
        # Work queued on the old device is abandoned (its results went with it); _initialize
        # closes the old device once the streams are closed and the pool released.
        await self.reopen()
        await self._verify_variants()

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> Opened[HostStream]:
        from accelkit_webgpu.executor import WebGPUKernelExecutor
        from accelkit_webgpu.factory_kernels import WebGPUFactoryKernels
        from accelkit_webgpu.fused_kernels import WebGPUFusedKernels
        from accelkit_webgpu.memory import WebGPUMemoryKernels
        from accelkit_webgpu.tensor_kernels import WebGPUTensorKernels

        old = self._gpu
        if old is None:  # a first open (not reopen() after a lost device)
            self._recoveries = []
        else:  # reopen(): the old device's streams are closed and its pool released
            old.close()  # (the backend stays `poisoned` until the new device is open)
        adapter = adapters()[device.index]
        caps = capabilities(adapter, device.index)
        limits = dict(adapter.limits)
        wanted = {k: limits[k] for k in _WANTED_LIMITS if k in limits}

        def open_device() -> Any:
            return adapter.request_device_sync(label=f"accelkit {device}", required_limits=wanted)

        try:
            wdevice = await anyio.to_thread.run_sync(open_device)
        except Exception as exc:
            raise DeviceError(f"cannot open a WebGPU device on {device}: {exc}") from None
        gpu = GPU(adapter, wdevice, str(device))
        # wgpu-py's first calls parse C types holding the GIL: pay that here, off the loop
        await anyio.to_thread.run_sync(gpu.warm_up)
        self._gpu = gpu
        self._kernels = kernels = WebGPUTensorKernels(self)
        return Opened(
            streams=[HostStream(device, f"{device}/default")],
            memory=WebGPUMemoryKernels(
                self, device, gpu, caps.limits.memory_bytes, self.pool_config
            ),
            tensor=kernels,
            factory=WebGPUFactoryKernels(self),
            fused=WebGPUFusedKernels(self),
            executor=WebGPUKernelExecutor(self),
            dtypes=caps.dtypes,
            capabilities=caps,
        )

    async def _shutdown(self) -> None:
        """The base's (queued work finishes, the streams close, the pool is released), then the
        device: idle, then destroyed."""
        gpu = self._gpu
        try:
            await super()._shutdown()
            if gpu is not None and gpu.lost is None:
                await anyio.to_thread.run_sync(gpu.wait_idle)
        finally:
            self._gpu = self._kernels = None
            if gpu is not None:
                gpu.close()

    # -- streams ----------------------------------------------------------------------------------
    def _open_stream(self) -> HostStream:
        device = self.default_stream.device
        return HostStream(device, f"{device}/stream{len(self.streams)}")

    async def _synchronize(self) -> None:
        await super()._synchronize()
        gpu = self._gpu
        if gpu is not None:
            await anyio.to_thread.run_sync(gpu.wait_idle)
