"""``CPUBackend``: the embedded backend on NumPy, always available.

Work runs on host streams (:mod:`accelkit._core.host_stream`): large operations on each stream's
worker thread, so the event loop stays free (NumPy releases the GIL in its loops and in BLAS),
small ones inline when the stream is idle, because the hand-off would cost more than the work.
The kernels are the host's NumPy bodies with the CPU JIT as their accelerator
(:mod:`accelkit._core.host_jit`); :meth:`CPUBackend.prepare` compiles and checks the JIT now.
"""

from __future__ import annotations

from collections.abc import Callable

from accelkit import __version__
from accelkit._core.host_jit import JIT
from accelkit._core.host_stream import HostStream
from accelkit._core.stream_backend import Opened, StreamBackend
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.dtype import DType

__all__ = ["CPUBackend"]


class CPUBackend(StreamBackend[HostStream]):
    """NumPy on the host CPU (device ``cpu:0``)."""

    name = "cpu"
    version = __version__
    device_kinds = frozenset({"cpu"})

    def _device_count(self) -> int:
        return 1

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        from accelkit.backends.cpu.probe import cpu_capabilities

        return cpu_capabilities()

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> Opened[HostStream]:
        from accelkit.backends.cpu.factory_kernels import CPUFactoryKernels
        from accelkit.backends.cpu.fused_kernels import CPUFusedKernels
        from accelkit.backends.cpu.memory import CPUMemoryKernels
        from accelkit.backends.cpu.tensor_kernels import CPUTensorKernels

        return Opened(
            streams=[HostStream(device, f"{device}/default")],
            memory=CPUMemoryKernels(self, device, self.pool_config),
            tensor=CPUTensorKernels(self),
            factory=CPUFactoryKernels(self),
            fused=CPUFusedKernels(self),
            dtypes=frozenset(DType),
        )

    async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
        """Import what the kernels import on first use (SciPy's special functions: erf, exact
        GELU) and compile and check the CPU JIT kernels now, on a worker thread, rather than in
        the background on first need: an import or a Numba compile holds the GIL, which this
        backend shares with the event loop, for up to seconds. None when all are ready (or the
        JIT is off on purpose), else a note on those left out (NumPy's code runs for them)."""
        import anyio

        from accelkit._core.host_kernels.elementwise import preload

        self.check_ready()
        await anyio.to_thread.run_sync(preload)
        return await JIT.prepare(progress)

    # -- streams ----------------------------------------------------------------------------------
    def _open_stream(self) -> HostStream:
        return HostStream(self.default_stream.device, f"cpu:0/stream{len(self.streams)}")
