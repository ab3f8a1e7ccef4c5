"""``OpenCLBackend``: one OpenCL device, its context, and in-order command queues as streams.

Imported only when a user creates an ``opencl`` backend; PyOpenCL is imported here.
"""

from __future__ import annotations

from typing import Any

import anyio
import pyopencl as cl

from accelkit._core.queued_backend import QueuedBackend
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import DeviceError
from accelkit.memory import MemoryPoolConfig
from accelkit_opencl.probe import capabilities, cl_devices
from accelkit_opencl.stream import CLStream

__all__ = ["OpenCLBackend"]

_VERSION = "0.1.0"


class OpenCLBackend(QueuedBackend):
    """An OpenCL device (``opencl:N``, numbered over every platform as the probe lists them)."""

    name = "opencl"
    version = _VERSION
    device_kinds = frozenset({"opencl"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__()
        self._pool_config = pool_config or MemoryPoolConfig()
        self._streams: list[CLStream] = []
        self._default: CLStream | None = None
        self._device_obj = Device("opencl", 0)
        self._cl_device: Any = None
        self._context: Any = None
        self._kernels: dict[tuple[str, str], Any] = {}

    def _device_count(self) -> int:
        return len(cl_devices())

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        return capabilities(cl_devices()[index], index)

    @staticmethod
    def _event_done(event: Any) -> bool:
        status = event.command_execution_status
        return bool(status == cl.command_execution_status.COMPLETE or status < 0)

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> None:
        from accelkit_opencl.factory import OpenCLTensorFactory
        from accelkit_opencl.kernel_ops import OpenCLKernelOps
        from accelkit_opencl.kernels import OpenCLKernelExecutor, ProgramCache
        from accelkit_opencl.memory import OpenCLMemoryManager
        from accelkit_opencl.ops import OpenCLTensorOps

        cl_device = cl_devices()[device.index]
        try:
            context = await anyio.to_thread.run_sync(lambda: cl.Context([cl_device]))
        except cl.Error as exc:
            raise DeviceError(f"cannot create an OpenCL context on {device}: {exc}") from None
        self._cl_device = cl_device
        self._context = context
        self._caps = capabilities(cl_device, device.index)
        self.supported_dtypes = self._caps.dtypes
        self._device_obj = device
        self._default = CLStream(context, cl_device, device, f"{device}/default")
        self._streams = [self._default]
        self._kernels = {}
        self._programs = ProgramCache(context, cl_device)
        wg = min(256, int(cl_device.max_work_group_size))
        self._reduce_wg = 1 << (wg.bit_length() - 1)
        self._memory_manager = OpenCLMemoryManager(
            self, device, context, int(cl_device.global_mem_size), self._pool_config
        )
        self._pool = self._memory_manager.pool
        self._tensor_ops = OpenCLTensorOps(self)
        self._tensor_factory = OpenCLTensorFactory(self)
        self._kernel_executor = OpenCLKernelExecutor(self)
        self._kernel_ops = OpenCLKernelOps(self)

    async def _synchronize(self) -> None:
        for stream in list(self._streams):
            await stream.synchronize()
        self._prune_streams()

    async def _shutdown(self) -> None:
        try:
            with anyio.CancelScope(shield=True):
                for stream in list(self._streams):
                    stream.discard_errors()  # unreported kernel errors die with the backend
                    await stream.synchronize()
                    await anyio.to_thread.run_sync(stream.close)
        finally:
            self._forget_deferred()
            self._pool.invalidate_all(close=True)
            self._streams = []
            self._kernels = {}

    # -- device programs --------------------------------------------------------------------------
    def _kernel(self, source: str, name: str) -> Any:
        """The kernel ``name`` of a generated program (built once per backend, cached on disk)."""
        kernel = self._kernels.get((source, name))
        if kernel is None:
            _, program = self._programs.get(source)
            kernel = cl.Kernel(program, name)
            self._kernels[(source, name)] = kernel
        return kernel

    def _gemm_tiles(self, dtype: DType) -> tuple[int, int]:
        """(tile, work per thread) for the GEMM kernel, from the device's limits."""
        dev = self._cl_device
        local = int(dev.local_mem_size)
        item = 8 if dtype in (DType.F64, DType.I64, DType.U64) else 4
        if int(dev.max_work_group_size) >= 64 and 2 * 32 * 33 * item <= local:
            return 32, 4
        return 8, 1

    # -- streams ----------------------------------------------------------------------------------
    def create_stream(self) -> CLStream:
        self._require_ready()
        stream = CLStream(
            self._context,
            self._cl_device,
            self._device_obj,
            f"{self._device_obj}/stream{len(self._streams)}",
        )
        # Blocks freed while there was one queue went back to the pool at once; work queued
        # before may still use them, so the new queue starts after it.
        busy = self._busy_events()
        if busy:
            stream.record(cl.enqueue_barrier(stream.queue, wait_for=busy))
        self._streams.append(stream)
        return stream

    def _busy_events(self, exclude: CLStream | None = None) -> list[Any]:
        """The last pending event of every stream but ``exclude``."""
        events = []
        for s in self._streams:
            if s is not exclude:
                event = s.last_event()
                if event is not None:
                    events.append(event)
        return events

    def _generation(self) -> int:
        pool: Any = getattr(self, "_pool", None)
        return pool.generation if pool is not None else 0
