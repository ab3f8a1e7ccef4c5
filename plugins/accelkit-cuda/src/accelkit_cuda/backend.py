"""``CUDABackend``: one NVIDIA GPU through CuPy, with CUDA streams, cuBLAS and NVRTC kernels.

Imported only when a user creates a ``cuda`` backend; CuPy is imported here.
"""

from __future__ import annotations

from typing import Any

import anyio

from accelkit.capabilities import BackendCapabilities, LifecycleState
from accelkit.device import Device
from accelkit.errors import (
    AccelError,
    ContextPoisonedError,
    DeviceError,
)
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import QueuedBackend
from accelkit_cuda import __version__
from accelkit_cuda.driver import DeviceProps, DriverUnavailable, read_devices
from accelkit_cuda.errors import RebuildLimiter
from accelkit_cuda.probe import capabilities, cupy_status
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream
from accelkit_cuda.submission import SubmissionThread

__all__ = ["CUDABackend"]


def _devices() -> list[DeviceProps]:
    try:
        return read_devices()
    except DriverUnavailable as exc:
        raise DeviceError(f"no CUDA devices: {exc}") from None


class CUDABackend(QueuedBackend):
    """An NVIDIA GPU (``cuda:N``, numbered as the driver lists them)."""

    name = "cuda"
    version = __version__
    device_kinds = frozenset({"cuda"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._streams: list[CUDAStream] = []
        self._default: CUDAStream | None = None
        self._device_obj = Device("cuda", 0)
        self._cp_device: Any = None
        self._arch = "sm_80"
        self._poisoned: ContextPoisonedError | None = None
        self._rebuilds = RebuildLimiter()
        self._context: Any = None  # memory.Context, made at initialize
        self._thread: SubmissionThread = None  # type: ignore[assignment]  # made at initialize
        #: Objects of rebuilt contexts, never destroyed (see :meth:`recover`).
        self._graveyard: list[Any] = []

    def _device_count(self) -> int:
        return len(_devices())

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        devices = _devices()
        if index >= len(devices):
            raise DeviceError(f"no CUDA device cuda:{index}")
        return capabilities(devices[index])

    @staticmethod
    def _event_done(event: Any) -> bool:
        return bool(event.done)

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> None:
        missing = cupy_status()
        if missing is not None:
            raise DeviceError(missing)
        devices = await anyio.to_thread.run_sync(_devices)  # driver calls: off the loop
        if device.index >= len(devices):
            raise DeviceError(f"no CUDA device {device}: the driver lists {len(devices)}")
        import cupy

        from accelkit_cuda.memory import Context

        props = devices[device.index]
        self._cp_device = cupy.cuda.Device(device.index)
        self._thread = SubmissionThread(device.index, str(device))
        self._context = Context(device.index, self._thread)

        def open_context() -> None:
            cupy.cuda.runtime.free(0)  # creates the primary context (can take a second)

        try:
            await self._thread.call(open_context)
        except CUDA_ERRORS as exc:
            await anyio.to_thread.run_sync(self._thread.close)
            raise DeviceError(f"cannot open a CUDA context on {device}: {exc}") from None
        major, minor = props.compute_capability
        self._arch = f"sm_{major}{minor}"
        self._caps = capabilities(props)
        self.supported_dtypes = self._caps.dtypes
        self._device_obj = device
        self._build(device, props)
        await self._fused.load()

    def _build(self, device: Device, props: DeviceProps) -> None:
        """Everything that lives in the CUDA context (again after a rebuild)."""
        from accelkit_cuda.factory import CUDAFactoryKernels
        from accelkit_cuda.kernel_ops import CUDAFusedKernels, FusedProgram
        from accelkit_cuda.kernels import CUDAKernelExecutor
        from accelkit_cuda.memory import CUDAMemoryManager
        from accelkit_cuda.ops import CUDATensorKernels

        default = CUDAStream(device, f"{device}/default", self._thread, self._failed)
        self._streams = []
        self._add_stream(default)
        self._memory_manager = CUDAMemoryManager(
            self, device, props.total_memory, self._pool_config
        )
        self._pool = self._memory_manager.pool
        self._kernel_executor = CUDAKernelExecutor(self)
        self._fused = FusedProgram(self)
        self.install_kernels(
            CUDATensorKernels(self), CUDAFactoryKernels(self), CUDAFusedKernels(self)
        )

    async def _shutdown(self) -> None:
        thread = self._thread
        try:
            with anyio.CancelScope(shield=True):
                for stream in list(self._streams):
                    stream.discard_errors()
                    if self._poisoned is None:
                        await stream.wait_quietly(stream.submitted)  # errors: nobody to tell
                        await anyio.to_thread.run_sync(stream.close)
                    else:
                        stream.abandon()
        finally:
            self._forget_deferred()
            self.pool.invalidate_all(close=True)  # the frees are queued on the thread
            self._streams = []
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.close)  # runs them, then ends

    # -- a poisoned context -----------------------------------------------------------------------
    def _failed(self, error: AccelError) -> AccelError:
        """Note a sticky error (the context is unusable until :meth:`recover`); returns it."""
        if isinstance(error, ContextPoisonedError) and self._poisoned is None:
            self._poisoned = error
            self._error = str(error)
        return error

    def _check_usable(self) -> None:
        if self._poisoned is not None:
            raise ContextPoisonedError(
                f"the CUDA context of {self._device_obj} is poisoned ({self._poisoned}); await"
                " backend.recover() to rebuild it"
            )

    @property
    def poisoned(self) -> bool:
        return self._poisoned is not None

    async def recover(self) -> None:
        """Rebuild the CUDA context after a sticky error.

        Resets the device's primary context, bumps the generation (tensors, buffers and kernel
        handles from before raise StaleHandleError) and builds fresh streams, pool and fused
        kernels. More than :data:`~accelkit_cuda.errors.MAX_REBUILDS` rebuilds within the
        window mark the backend failed: DeviceError, and it must be shut down.
        """
        self._require_ready()
        if self._poisoned is None:
            return
        if not self._rebuilds.allow():
            self._state = LifecycleState.FAILED
            raise DeviceError(
                f"{self._device_obj} poisoned its context again after"
                f" {self._rebuilds.describe()}; the device is marked failed"
            )
        from accelkit_cuda.driver import driver

        device = self._device_obj
        props = _devices()[device.index]
        # Everything that holds a handle of the dead context is forgotten without a CUDA call,
        # and kept referenced (a bounded leak: at most MAX_REBUILDS per window) so that no
        # destructor later frees or destroys a handle value the new context may reuse.
        # First: the pool's blocks now belong to a dead generation, and are never freed.
        self._context.generation += 1
        self.pool.invalidate_all(close=True)
        for stream in self._streams:
            stream.abandon()
        self._forget_deferred()
        self._graveyard.append((self._streams, self._fused, self._kernel_executor))
        assert self._kernel_executor is not None
        self._kernel_executor.forget_all()  # type: ignore[attr-defined]
        self._streams, self._default = [], None

        def reset() -> None:
            import cupy

            self._graveyard.append(
                (cupy.get_default_memory_pool(), cupy.get_default_pinned_memory_pool())
            )
            cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)
            cupy.cuda.set_pinned_memory_allocator(cupy.cuda.PinnedMemoryPool().malloc)
            cupy._util.clear_memo()  # kernels CuPy compiled and loaded into the old context
            driver().reset_primary_context(device.index)
            cupy.cuda.runtime.free(0)  # a fresh primary context

        with anyio.CancelScope(shield=True):
            await self._thread.call(reset)
        self._poisoned = None
        self._error = None
        self._build(device, props)
        await self._fused.load()

    # -- streams ----------------------------------------------------------------------------------
    def create_stream(self) -> CUDAStream:
        self._require_ready()
        self._check_usable()
        # Blocks recycled while there was one stream may still be in use by queued work:
        # the new stream starts after everything queued so far (on the submission thread).
        stream = CUDAStream(
            self._device_obj, f"{self._device_obj}/stream{len(self._streams)}", self._thread,
            self._failed, after=list(self._streams),
        )  # fmt: skip
        self._add_stream(stream)
        for s in self._streams:
            s.track = True
        return stream

    def _generation(self) -> int:
        return int(self._context.generation) if self._context is not None else 1
