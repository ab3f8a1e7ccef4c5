"""``CUDABackend``: one NVIDIA GPU through CuPy, with CUDA streams, cuBLAS and NVRTC kernels.

Imported only when a user creates a ``cuda`` backend; CuPy is imported here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio

from accelkit.capabilities import BackendCapabilities, BackendStatus, LifecycleState
from accelkit.device import Device
from accelkit.errors import (
    AccelError,
    ContextPoisonedError,
    DeviceError,
    NotInitializedError,
)
from accelkit.memory import MemoryPoolConfig
from accelkit.sdk import GraphRecording, NativeGraph, Opened, QueuedBackend
from accelkit_cuda import __version__
from accelkit_cuda.driver import DeviceProps, DriverUnavailable, read_devices
from accelkit_cuda.errors import RESTART, translate
from accelkit_cuda.probe import capabilities, cupy_status
from accelkit_cuda.stream import CUDA_ERRORS, CUDAStream
from accelkit_cuda.submission import SubmissionThread

if TYPE_CHECKING:
    from accelkit_cuda.cudnn_attention import CudnnAttention
    from accelkit_cuda.executor import CUDAKernelExecutor
    from accelkit_cuda.flash_attention import Flash2Attention
    from accelkit_cuda.flash_decode import FlashDecode
    from accelkit_cuda.flash_simt import SimtAttention
    from accelkit_cuda.fused_kernels import CUDAFusedKernels, FusedProgram
    from accelkit_cuda.memory import CUDAMemoryKernels
    from accelkit_cuda.philox import PhiloxProgram

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


class CUDABackend(QueuedBackend[CUDAStream]):
    """An NVIDIA GPU (``cuda:N``, numbered as the driver lists them)."""

    name = "cuda"
    version = __version__
    device_kinds = frozenset({"cuda"})

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._device_obj = Device("cuda", 0)
        #: ``_device_obj.index`` as a plain attribute (every tensor's storage records it).
        self.device_index = 0
        self._cp_device: Any = None
        self._arch = "sm_80"
        #: The first sticky fault (see :meth:`_failed`); never cleared.
        self._poisoned: ContextPoisonedError | None = None
        #: The device's submission thread (made at initialize; None before).
        self._thread: SubmissionThread | None = None
        #: What ``_build`` made (the base holds them too; these stay for the teardown of a
        #: poisoned context, which keeps them referenced, and for the fused program's users).
        self._memory: CUDAMemoryKernels | None = None
        self._executor: CUDAKernelExecutor | None = None
        self._fused: FusedProgram | None = None
        #: The Philox draw kernels (made and loaded at initialize; None before).
        self.philox: PhiloxProgram | None = None
        #: The fused kernels (TensorOps' attention launches their flash kernel).
        self._fused_kernels: CUDAFusedKernels | None = None
        #: Attention's engines: cuDNN's graphs where installed, with their records.
        self._attention: CudnnAttention | None = None
        #: cuDNN's frontend as loaded at initialize (None: absent; then the reason).
        self._cudnn: tuple[Any, str | None] = (None, "not initialized")
        #: Whether f32 GEMMs may run on TF32 tensor cores (10-bit mantissa inputs), as
        #: ``torch.backends.cuda.matmul.allow_tf32``: off unless ``ACCELKIT_CUDA_ALLOW_TF32=1``
        #: or set here (it applies to GEMMs submitted after the change).
        self.allow_tf32: bool = _tf32_default()
        #: The tensor-core attention kernel and its on-device verdict (made at initialize).
        self._flash2: Flash2Attention | None = None
        #: The split-KV decode kernel for paged_attention and its verdict (made at initialize).
        self._flash_decode: FlashDecode | None = None
        #: The register-tiled f32 attention kernel and its verdict (made at initialize).
        self._flash_simt: SimtAttention | None = None

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

    def prune_streams(self) -> None:
        # Here before every allocation and statistics query: a poisoned backend stops here,
        # and a fault first seen by an event query is told as one.
        self._check_usable()
        if self.deferred_pending:  # frees wait for every stream to pass their points
            for s in self.streams:
                s.poll_quiet()
        try:
            super().prune_streams()
        except CUDA_ERRORS as exc:
            raise self._failed(translate(exc, "checking which work has completed")) from None

    @property
    def thread(self) -> SubmissionThread:
        """The device's submission thread, where every CUDA call is made."""
        thread = self._thread
        if thread is None:
            raise NotInitializedError(f"backend {self.name!r} has no submission thread yet")
        return thread

    @property
    def attention_engines(self) -> CudnnAttention:
        """Attention's engines and their records (:mod:`accelkit_cuda.cudnn_attention`)."""
        engines = self._attention
        if engines is None:
            raise NotInitializedError(f"backend {self.name!r} has no attention engines yet")
        return engines

    @property
    def fused(self) -> FusedProgram:
        """The fused NVRTC program (loaded at initialize)."""
        fused = self._fused
        if fused is None:
            raise NotInitializedError(f"backend {self.name!r} has no fused program yet")
        return fused

    @property
    def flash2(self) -> Flash2Attention | None:
        """The tensor-core attention kernel (None before initialize); ``flash2.state`` says
        whether it passed its on-device check and serves attention."""
        return self._flash2

    @property
    def flash_decode(self) -> FlashDecode | None:
        """The split-KV decode kernel of ``paged_attention`` (None before initialize);
        ``flash_decode.state`` says whether it passed its on-device check and serves decode."""
        return self._flash_decode

    @property
    def flash_simt(self) -> SimtAttention | None:
        """The register-tiled f32 attention kernel (None before initialize);
        ``flash_simt.state`` says whether it passed its on-device check and serves f32
        attention."""
        return self._flash_simt

    # -- lifecycle --------------------------------------------------------------------------------
    async def _initialize(self, device: Device) -> Opened[CUDAStream]:
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

        old = self._thread
        if old is not None and not old.closed:
            # reopen(): the old pool was released; what tensors still hold goes too, then the
            # old thread runs its queued frees and ends.
            self._release_blocks()
            await anyio.to_thread.run_sync(old.close)
        props = devices[device.index]
        self._cp_device = cupy.cuda.Device(device.index)
        thread = self._thread = SubmissionThread(device.index, str(device))

        def open_context() -> None:
            cupy.cuda.runtime.free(0)  # creates the primary context (can take a second)

        try:
            await thread.call(open_context)
        except CUDA_ERRORS as exc:
            await anyio.to_thread.run_sync(thread.close)
            raise DeviceError(f"cannot open a CUDA context on {device}: {exc}") from None
        major, minor = props.compute_capability
        self._arch = f"sm_{major}{minor}"
        self._device_obj = device
        self.device_index = device.index
        made: list[Any] = []  # the streams and the pool, as they are made
        try:
            return await self._open_in_context(device, props, made)
        except BaseException:
            # Failed or cancelled after the submission thread started: what was opened is
            # closed here (a shutdown has nothing to close: the backend never became ready).
            with anyio.CancelScope(shield=True):
                await self._close_failed_open(thread, made)
            raise

    async def _open_in_context(
        self, device: Device, props: DeviceProps, made: list[Any]
    ) -> Opened[CUDAStream]:
        """:meth:`_initialize` once the context is open: the components (their streams and
        pool appended to ``made`` as each is made), the kernels' compiles and checks, the
        warm-up."""
        from accelkit_cuda.cudnn_attention import load_frontend

        self._cudnn = await anyio.to_thread.run_sync(load_frontend)  # loads a library
        opened = self._build(device, props, made)
        from accelkit_cuda.flash_attention import Flash2Attention
        from accelkit_cuda.flash_decode import FlashDecode
        from accelkit_cuda.flash_simt import SimtAttention

        flash2 = self._flash2 = Flash2Attention(self, props)
        decode = self._flash_decode = FlashDecode(self, props)
        simt = self._flash_simt = SimtAttention(self, props)
        fast = getattr(opened.tensor, "fast", None)  # the raw elementwise kernels
        from accelkit_cuda.philox import PhiloxProgram

        philox = self.philox = PhiloxProgram(self)  # the draws (CuPy's generator if it fails)
        async with anyio.create_task_group() as tg:  # the NVRTC compiles side by side
            tg.start_soon(self.fused.load)
            tg.start_soon(philox.load)  # before serving: a seed's numbers take one path
            tg.start_soon(flash2.load)  # compiled, checked on the device (a child), loaded
            tg.start_soon(decode.load)  # the same
            tg.start_soon(simt.load)  # the same
            if fast is not None:  # not at the first add of a request (docs/backends/cuda.md)
                tg.start_soon(fast.load)
        if opened.capabilities is not None:  # which kernel serves f16/bf16 attention, and why
            caps = opened.capabilities
            extra = {
                **caps.extra, "flash2_attention": flash2.describe(),
                "flash_decode": decode.describe(), "flash_simt_attention": simt.describe(),
            }  # fmt: skip
            opened = replace(opened, capabilities=caps.model_copy(update={"extra": extra}))
        await self.thread.call(lambda: _warm_up(draws=not philox.ready))
        return opened

    async def _close_failed_open(self, thread: SubmissionThread, made: list[Any]) -> None:
        """After a failed or cancelled open: the streams closed after their queued work, the
        pool's blocks freed, then the submission thread ended (it runs what is queued)."""
        try:
            for item in made:
                if isinstance(item, CUDAStream):
                    await anyio.to_thread.run_sync(item.close)
                else:
                    item.invalidate_all(close=True)  # the pool: frees queued on the thread
        except Exception:  # a poisoned context, say: the thread still ends
            _log.debug("closing a failed open of %s", self._device_obj, exc_info=True)
        finally:
            await anyio.to_thread.run_sync(thread.close)

    def _build(self, device: Device, props: DeviceProps, made: list[Any]) -> Opened[CUDAStream]:
        """Everything that lives in the CUDA context (its streams and pool also appended to
        ``made`` as they are made: an open that fails later closes them)."""
        from accelkit_cuda.cudnn_attention import CudnnAttention
        from accelkit_cuda.executor import CUDAKernelExecutor
        from accelkit_cuda.factory_kernels import CUDAFactoryKernels
        from accelkit_cuda.fused_kernels import CUDAFusedKernels, FusedProgram
        from accelkit_cuda.memory import CUDAMemoryKernels
        from accelkit_cuda.tensor_kernels import CUDATensorKernels

        self._attention = CudnnAttention(*self._cudnn, props.compute_capability, self.thread.submit)
        caps = capabilities(
            props, (self._attention.engine, self._attention.unavailable or "cuDNN's SDPA graphs")
        )
        default = CUDAStream(device, f"{device}/default", self.thread, self._failed)
        default.check_usable = self._check_usable
        made.append(default)
        memory = self._memory = CUDAMemoryKernels(
            self, device, props.total_memory, self.pool_config
        )
        made.append(memory.pool)
        self._executor = CUDAKernelExecutor(self)
        self._fused = FusedProgram(self)
        fused = self._fused_kernels = CUDAFusedKernels(self)
        return Opened(
            streams=[default],
            memory=memory,
            tensor=CUDATensorKernels(self),
            factory=CUDAFactoryKernels(self),
            fused=fused,
            executor=self._executor,
            dtypes=caps.dtypes,
            capabilities=caps,
        )

    async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
        """The one-time device work is done at initialize (the fused program's compile, the
        on-device checks of the tensor-core and the tiled f32 attention kernels); returns None
        when attention runs them, else a note saying why the older kernel serves it."""
        self.check_ready()
        notes = []
        for kernel, what, dtypes in (
            (self._flash2, "tensor-core attention kernel", "f16/bf16"),
            (self._flash_simt, "f32 tiled attention kernel", "f32"),
        ):
            if kernel is None:
                continue
            if progress is not None:
                progress(f"{what}: {kernel.describe()}")
            if not kernel.verified:
                notes.append(
                    f"attention: the warp-per-row kernel serves {dtypes} ({kernel.describe()})"
                )
        return "; ".join(notes) or None

    def _release_blocks(self) -> None:
        """Queue the frees of the blocks tensors still hold (stale now: the pool was released);
        left to the process when poisoned."""
        if self._memory is not None:
            self._memory.release_blocks()

    async def _shutdown(self) -> None:
        thread, streams = self._thread, self.streams
        try:
            for stream in streams:
                if self._poisoned is None:
                    # Errors stay for their awaits (work another task submitted meanwhile).
                    await stream.wait_for_quietly(stream.submitted)
                    await anyio.to_thread.run_sync(stream.close)
        except ContextPoisonedError:
            pass  # the fault is noted (status); shutdown still releases what it can
        finally:
            # The deferred frees are forgotten by QueuedBackend after this.
            self.pool.invalidate_all(close=True)  # the frees are queued on the thread
            # Blocks still held by tensors that outlive the backend (stale now): their frees
            # queued here, once, by their one owner (or left to the process when poisoned).
            self._release_blocks()
            if self._attention is not None:
                destroy = self._attention.close()
                if destroy is not None and thread is not None and self._poisoned is None:
                    thread.submit(destroy)
            if self._poisoned is not None:
                for stream in streams:
                    stream.abandon()
                _LEFT_TO_THE_PROCESS.append((streams, self._fused, self._executor, self.philox))
            if thread is not None:
                await anyio.to_thread.run_sync(thread.close)  # runs them, then ends

    # -- a poisoned context -----------------------------------------------------------------------
    def _failed(self, error: AccelError) -> AccelError:
        """Every CUDA error passes here on its way to the caller. The first sticky one poisons
        the backend (and the device's context for this process); once poisoned, any error is
        reported as the poisoning, naming the first fault. Returns the error to raise."""
        if self._poisoned is None and isinstance(error, ContextPoisonedError):
            self._poisoned = error
            self.report_error(f"poisoned: {error}")
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
        if self._poisoned is not None and self.state is LifecycleState.READY:
            raise self._poison_error()

    def check_ready(self) -> None:
        # Every component's entry (the facades, the memory manager, kernels, synchronize,
        # streams) checks readiness here, so a poisoned backend refuses them all alike;
        # ``status`` and ``shutdown`` do not come here.
        super().check_ready()
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
        # Without a CUDA call (every one would fail, and memory_info refuses): the counts as
        # last seen, the pool's own accounting.
        return BackendStatus(
            backend=self.name,
            state=self.state,
            device=str(self.device) if self.device else None,
            generation=self.generation,
            pending_operations=self.pending_operations,
            completed_operations=self.completed_operations,
            memory_used_bytes=self._memory.pool.info().used if self._memory is not None else 0,
            error=f"poisoned: {self._poisoned}",
        )

    # -- streams ----------------------------------------------------------------------------------
    async def _capture_graph(self, recording: GraphRecording) -> NativeGraph | None:
        """A CUDA graph of the capture (:mod:`accelkit_cuda.graphs`; unverified on a GPU), or
        None where it cannot be made: its calls are then replayed."""
        from accelkit_cuda.graphs import capture_graph

        return await capture_graph(self, recording)

    def _open_stream(self) -> CUDAStream:
        # Blocks recycled while there was one stream may still be in use by queued work:
        # the new stream starts after everything queued so far (on the submission thread).
        streams = self.streams
        dev = self._device_obj
        stream = CUDAStream(
            dev, f"{dev}/stream{len(streams)}", self.thread, self._failed, after=streams
        )
        stream.check_usable = self._check_usable
        # With two streams and more, work keeps its tensors referenced until it has completed.
        for s in (*streams, stream):
            s.track = True
        return stream


def _tf32_default() -> bool:
    from accelkit.sdk import env_str

    return (env_str("ACCELKIT_CUDA_ALLOW_TF32") or "0").lower() in ("1", "true", "yes", "on")


def _warm_up(draws: bool) -> None:
    """The common CuPy kernels and cuBLAS's handle, made on the submission thread now rather than
    at a first request (cupy_tensor.warm_up; ``draws``: CuPy's generator too, the fallback of the
    Philox kernels); a kernel that fails here is only logged: the op that needs it reports its
    own error when called."""
    from accelkit_cuda import cupy_tensor

    try:
        cupy_tensor.warm_up(draws)
    except Exception as exc:
        _log.warning("warming up CuPy's kernels failed: %s", exc)
