"""``OpenCLBackend``: one OpenCL device, its context, and in-order command queues as streams.

Imported only when a user creates an ``opencl`` backend; PyOpenCL is imported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import pyopencl as cl

from accelkit.abc.backend import ComputeBackend
from accelkit.abc.stream import Stream
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import DeviceError, InvalidArgumentError
from accelkit.memory import MemoryPoolConfig
from accelkit_opencl.probe import capabilities, cl_devices
from accelkit_opencl.stream import CLStream

__all__ = ["OpenCLBackend"]

_VERSION = "0.1.0"


class OpenCLBackend(ComputeBackend):
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
        self._caps: BackendCapabilities | None = None
        self._kernels: dict[tuple[str, str], Any] = {}
        self._deferred: list[tuple[list[Any], Callable[[], None]]] = []
        self._deferred_lock = threading.Lock()

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        if d.kind != "opencl":
            return False
        try:
            return d.index < len(cl_devices())
        except DeviceError:
            return False

    @property
    def capabilities(self) -> BackendCapabilities:
        if self._caps is not None:
            return self._caps
        index = self._device.index if self._device is not None else 0
        return capabilities(cl_devices()[index], index)

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
            with self._deferred_lock:
                self._deferred = []
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
    @property
    def default_stream(self) -> Stream:
        self._require_ready()
        assert self._default is not None
        return self._default

    def create_stream(self) -> CLStream:
        self._require_ready()
        stream = CLStream(
            self._context,
            self._cl_device,
            self._device_obj,
            f"{self._device_obj}/stream{len(self._streams)}",
        )
        self._streams.append(stream)
        return stream

    def _check_stream(self, stream: Stream) -> None:
        if stream not in self._streams:
            raise InvalidArgumentError(f"{stream!r} is not a stream of this {self.name} backend")

    def _busy_events(self, exclude: CLStream | None = None) -> list[Any]:
        """The last pending event of every stream but ``exclude``."""
        events = []
        for s in self._streams:
            if s is not exclude:
                event = s.last_event()
                if event is not None:
                    events.append(event)
        return events

    def _after_events(self, events: list[Any], fn: Callable[[], None]) -> None:
        """Run ``fn`` once every event in ``events`` has completed (checked when streams are
        pruned: at allocation-statistics queries, synchronization and later frees)."""
        with self._deferred_lock:
            self._deferred.append((events, fn))

    def _prune_streams(self) -> None:
        for s in self._streams:
            s.prune()
        if not self._deferred:
            return
        with self._deferred_lock:
            ready = [
                fn
                for events, fn in self._deferred
                if all(
                    e.command_execution_status in (cl.command_execution_status.COMPLETE,)
                    or e.command_execution_status < 0
                    for e in events
                )
            ]
            self._deferred = [(ev, fn) for ev, fn in self._deferred if fn not in ready]
        for fn in ready:
            fn()

    def _pending_operations(self) -> int:
        return sum(s.submitted - s.completed for s in self._streams)

    def _completed_operations(self) -> int:
        return sum(s.completed for s in self._streams)

    def _generation(self) -> int:
        pool: Any = getattr(self, "_pool", None)
        return pool.generation if pool is not None else 0
