"""``CUDABackend``: one NVIDIA GPU through CuPy, with CUDA streams, cuBLAS and NVRTC kernels.

Imported only when a user creates a ``cuda`` backend; CuPy is imported here.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from accelkit.capabilities import BackendCapabilities, BackendStatus, LifecycleState
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
from accelkit_cuda.errors import RESTART, translate
from accelkit_cuda.probe import capabilities, cupy_status
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream
from accelkit_cuda.submission import SubmissionThread

_log = logging.getLogger("accelkit.cuda")
__all__ = ["CUDABackend"]

#: The first sticky fault of each device's context in this process (device index -> error):
#: the primary context is shared by every backend on that device, so a new backend there
#: would be poisoned too.
_POISONED_DEVICES: dict[int, ContextPoisonedError] = {}
#: CUDA objects of poisoned backends (streams, modules, kernels), kept referenced so that no
#: destructor calls into the dead context (a bounded leak: the process must exit anyway).
_LEFT_TO_THE_PROCESS: list[Any] = []


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
        #: The first sticky fault (see :meth:`_failed`); never cleared.
        self._poisoned: ContextPoisonedError | None = None
        self._thread: SubmissionThread = None  # type: ignore[assignment]  # made at initialize

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

    def _prune_streams(self) -> None:
        # Here before every allocation and statistics query: a poisoned backend stops here,
        # and a fault first seen by an event query is told as one.
        self._check_usable()
        try:
            super()._prune_streams()
        except CUDA_ERRORS as exc:
            raise self._failed(translate(exc, "checking which work has completed")) from None

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> None:
        missing = cupy_status()
        if missing is not None:
            raise DeviceError(missing)
        devices = await anyio.to_thread.run_sync(_devices)  # driver calls: off the loop
        if device.index >= len(devices):
            raise DeviceError(f"no CUDA device {device}: the driver lists {len(devices)}")
        if device.index in _POISONED_DEVICES:
            raise ContextPoisonedError(
                f"{device}: {RESTART}; its first fault: {_POISONED_DEVICES[device.index]}"
            )
        import cupy

        props = devices[device.index]
        self._cp_device = cupy.cuda.Device(device.index)
        self._thread = SubmissionThread(device.index, str(device))

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
        await self._thread.call(_warm_up)

    def _build(self, device: Device, props: DeviceProps) -> None:
        """Everything that lives in the CUDA context."""
        from accelkit_cuda.factory_kernels import CUDAFactoryKernels
        from accelkit_cuda.fused_kernels import CUDAFusedKernels, FusedProgram
        from accelkit_cuda.executor import CUDAKernelExecutor
        from accelkit_cuda.memory import CUDAMemoryManager
        from accelkit_cuda.tensor_kernels import CUDATensorKernels

        default = CUDAStream(device, f"{device}/default", self._thread, self._failed)
        default.check_usable = self._check_usable
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
        except ContextPoisonedError:
            pass  # the fault is noted (status); shutdown still releases what it can
        finally:
            self._forget_deferred()
            self.pool.invalidate_all(close=True)  # the frees are queued on the thread
            # Blocks still held by tensors that outlive the backend (stale now): their frees
            # queued here, once, by their one owner (or left to the process when poisoned).
            self._memory_manager.release_blocks()  # type: ignore[union-attr]
            if self._poisoned is not None:
                for stream in self._streams:
                    stream.abandon()
                _LEFT_TO_THE_PROCESS.append(
                    (self._streams, getattr(self, "_fused", None), self._kernel_executor)
                )
            self._streams = []
            if thread is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(thread.close)  # runs them, then ends

    # -- a poisoned context -----------------------------------------------------------------------
    def _failed(self, error: AccelError) -> AccelError:
        """Every CUDA error passes here on its way to the caller. The first sticky one poisons
        the backend (and the device's context for this process); once poisoned, any error is
        reported as the poisoning, naming the first fault. Returns the error to raise."""
        if self._poisoned is None and isinstance(error, ContextPoisonedError):
            self._poisoned = error
            self._error = f"poisoned: {error}"
            _POISONED_DEVICES.setdefault(self._device_obj.index, error)
            return error
        if self._poisoned is not None and error is not self._poisoned:
            return self._poison_error()
        return error

    def _poison_error(self) -> ContextPoisonedError:
        return ContextPoisonedError(
            f"the CUDA context of {self._device_obj} is poisoned: {RESTART}. The first fault:"
            f" {self._poisoned}"
        )

    def _check_usable(self) -> None:
        # After shutdown the memory manager still answers memory_info() (everything released),
        # without a CUDA call: the streams are gone.
        if self._poisoned is not None and self._state is LifecycleState.READY:
            raise self._poison_error()

    def _require_ready(self) -> None:
        # Every component's entry (the facades, the memory manager, kernels, synchronize,
        # streams) checks readiness here, so a poisoned backend refuses them all alike;
        # ``status`` and ``shutdown`` do not come here.
        super()._require_ready()
        if self._poisoned is not None:
            raise self._poison_error()

    @property
    def poisoned(self) -> bool:
        """Whether a sticky CUDA error poisoned this backend (for good: see errors.py)."""
        return self._poisoned is not None

    @property
    def status(self) -> BackendStatus:
        if self._poisoned is None:
            return super().status
        # Without a CUDA call (every one would fail): the counts as last seen.
        done = sum(s._completed_upto for s in self._streams)
        return BackendStatus(
            backend=self.name,
            state=self._state,
            device=str(self._device) if self._device else None,
            generation=self._generation(),
            pending_operations=sum(s.submitted for s in self._streams) - done,
            completed_operations=done,
            memory_used_bytes=self._pool.info().used if self._pool is not None else 0,
            error=self._error,
        )

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
        stream.check_usable = self._check_usable
        self._add_stream(stream)
        for s in self._streams:
            s.track = True
        return stream


def _warm_up() -> None:
    """The common CuPy kernels and cuBLAS's handle, made on the submission thread now rather than
    at a first request (cupy_tensor.warm_up); a kernel that fails here is only logged: the op
    that needs it reports its own error when called."""
    from accelkit_cuda import cupy_tensor

    try:
        cupy_tensor.warm_up()
    except Exception as exc:
        _log.warning("warming up CuPy's kernels failed: %s", exc)
