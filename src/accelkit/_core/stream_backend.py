"""``StreamBackend``: the base class every backend is written on, and ``Opened``, the record its
``_initialize`` returns.

A backend author implements four hooks (``_device_count``, ``_device_capabilities``,
``_initialize`` and ``_open_stream``) and may extend ``_shutdown`` and ``_synchronize``;
everything else of :class:`~accelkit.abc.ComputeBackend` is here: the lifecycle and its states,
readiness checks, the user facades over the backend's kernel objects (the memory manager among
them), streams and the current stream, the memory pool, ``status`` and ``capabilities``.

``_initialize(device)`` opens the device and returns an :class:`Opened` record: the streams
(the default one first), the kernel objects (MemoryKernels, whose pool the backend allocates
from, TensorKernels, FactoryKernels, optional FusedKernels), the optional KernelExecutor,
the dtypes and the capabilities of the open device. Only this class assigns what the record
holds; :meth:`StreamBackend.reopen` builds a new one after a device was lost.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio

from accelkit._core.positions import PositionStream
from accelkit._core.sched import request_loop_slice, request_switch_interval
from accelkit.abc.backend import ComputeBackend
from accelkit.abc.stream import Stream
from accelkit.capabilities import BackendCapabilities, BackendStatus, LifecycleState
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import (
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    StaleHandleError,
    UnsupportedOperationError,
)
from accelkit.memory import MemoryPoolConfig

if TYPE_CHECKING:
    from accelkit._core.pool import CachingPool
    from accelkit.abc.kernels import KernelExecutor
    from accelkit.capture import GraphCapture, GraphRecording, NativeGraph, _Recorder
    from accelkit.fallback import FallbackTensorOps
    from accelkit.ops import KernelOps, MemoryManager, TensorFactory, TensorOps
    from accelkit.sdk.kernels import FactoryKernels, FusedKernels, MemoryKernels, TensorKernels

__all__ = ["Opened", "StreamBackend"]

#: The backend's stream type.
S = TypeVar("S", bound=PositionStream)
C = TypeVar("C")

#: ``LifecycleState.READY`` as a module constant: an enum member read through its class costs
#: about 100 ns on Python 3.11, and ``check_ready`` runs at every component entry (every op
#: reaches ``backend.tensor_ops``; every read of a tensor checks it).
_READY = LifecycleState.READY


@dataclass(frozen=True, kw_only=True)
class Opened(Generic[S]):
    """What a backend's ``_initialize`` returns: everything it opened on the device."""

    #: The backend's streams, the default one first (usually just the default).
    streams: Sequence[S]
    #: The memory kernels (``backend.memory_manager`` checks the arguments, then calls them);
    #: their ``pool`` is the pool every kernel allocates from.
    memory: MemoryKernels
    #: Every TensorOps kernel and output allocation.
    tensor: TensorKernels
    #: Fills, ranges, random numbers and host copies.
    factory: FactoryKernels
    #: The dtypes tensors may have on this device.
    dtypes: frozenset[DType]
    #: Fused transformer kernels (None: every KernelOps op runs as the core's composition).
    fused: FusedKernels | None = None
    #: User kernels (None: the backend has no kernel executor).
    executor: KernelExecutor | None = None
    #: The capabilities of the open device (None: probed through ``_device_capabilities``).
    capabilities: BackendCapabilities | None = None

    def __post_init__(self) -> None:
        if not self.streams:
            raise TypeError("Opened needs at least one stream: the default stream comes first")
        for s in self.streams:
            if not isinstance(s, PositionStream):
                raise TypeError(
                    f"Opened.streams holds {type(s).__name__}, which is no"
                    " accelkit.sdk.PositionStream"
                )
        from accelkit.sdk.kernels import MemoryKernels

        if not isinstance(self.memory, MemoryKernels):
            raise TypeError(
                f"Opened.memory is a {type(self.memory).__name__}, which is no"
                " accelkit.sdk.MemoryKernels (plugin API 3.0: the core's memory manager checks"
                " the arguments and calls your memory kernels)"
            )


#: How long an allocation that would exceed the pool's limit waits for the work queued on the
#: streams (which may hold the buffers of dropped tensors) before it is refused.
LIMIT_WAIT_S = 10.0


class StreamBackend(ComputeBackend, Generic[S]):
    """The base class of every backend (see the module docstring), generic in its stream type
    (``StreamBackend[HostStream]``)."""

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        self._state = LifecycleState.CREATED
        self._device: Device | None = None
        self.selected_device: Device | None = None
        self._error: str | None = None
        self._stream_var: contextvars.ContextVar[S | None] = contextvars.ContextVar(
            f"accelkit_{self.name}_stream_{id(self)}", default=None
        )
        self.supported_dtypes: frozenset[DType] = frozenset()
        self._pool_config = pool_config or MemoryPoolConfig()
        self._streams: list[S] = []
        #: The streams of earlier sessions (closed at a shutdown or reopen): ``use_stream`` names
        #: them stale rather than foreign.
        self._retired: weakref.WeakSet[S] = weakref.WeakSet()
        #: True while ``shutdown`` runs: ``create_stream`` refuses (the streams are closing).
        self._closing = False
        #: Set while ``initialize`` or ``shutdown`` runs (:meth:`_one_at_a_time`).
        self._lifecycle: anyio.Event | None = None
        #: The components of the sessions, by class (:meth:`_component`).
        self._components: dict[type, object] = {}
        self._default: S | None = None
        self._pool: CachingPool | None = None
        self._caps: BackendCapabilities | None = None
        self._tensor_ops: TensorOps | None = None
        self._tensor_factory: TensorFactory | None = None
        self._memory_manager: MemoryManager | None = None
        self._kernel_executor: KernelExecutor | None = None
        self._kernel_ops: KernelOps | None = None
        self._fallback_ops: FallbackTensorOps | None = None
        self.loop_thread_scheduling: str | None = None
        self.interpreter_switch_interval: str | None = None
        #: The open graph capture (``capture()``), if any: read by the host reads and waits,
        #: which a capture refuses; never by a submission.
        self._capture: _Recorder | None = None

    # -- hooks ------------------------------------------------------------------------------------
    @abstractmethod
    def _device_count(self) -> int:
        """How many devices of this kind there are; DeviceError saying why there are none."""

    @abstractmethod
    def _device_capabilities(self, index: int) -> BackendCapabilities:
        """The capabilities of device ``index`` (without initializing the backend)."""

    @abstractmethod
    async def _initialize(self, device: Device) -> Opened[S]:
        """Open ``device`` and return what was opened (see :class:`Opened`). Raise
        DeviceError (or another AccelError) saying why it cannot be opened."""

    @abstractmethod
    def _open_stream(self) -> S:
        """A new stream on the open device (``create_stream`` checks readiness first and
        registers it)."""

    async def _shutdown(self) -> None:
        """Finish the streams' queued work (its errors are not raised here; they stay for the
        awaits of their positions), close each stream off the loop, then release the pool. A backend that holds more (a device
        context, a thread) extends this and calls it. Runs shielded from cancellation."""
        try:
            for stream in list(self._streams):
                await stream.wait_for_quietly(stream.submitted)
                await anyio.to_thread.run_sync(stream.close)
        finally:
            if self._pool is not None:
                self._pool.invalidate_all(close=True)

    async def _capture_graph(self, recording: GraphRecording) -> NativeGraph | None:
        """Build this backend's own replay of a finished capture (a CUDA graph, say), or return
        None: the recorded calls are then replayed in order, which every backend can do. Runs
        on the event loop, shielded from cancellation, when the ``capture()`` block ends; the
        calls have run once already (the capture's own run). An error raised here fails the
        capture. None by default."""
        return None

    async def _synchronize(self) -> None:
        """Wait for every stream, in order (a backend with more to wait for extends this)."""
        for stream in list(self._streams):
            await stream.synchronize()

    # -- identity and capabilities ----------------------------------------------------------------
    @property
    def device(self) -> Device | None:
        return self._device

    @property
    def is_ready(self) -> bool:
        return self._state is _READY

    @property
    def state(self) -> LifecycleState:
        """The lifecycle state (``status.state`` without the counts)."""
        return self._state

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        if d.kind not in self.device_kinds or d.address is not None:
            return False  # an address ('cpu://host:1') names no device of an index-based backend
        try:
            return d.index < self._device_count()
        except DeviceError:
            return False

    @property
    def capabilities(self) -> BackendCapabilities:
        if self._caps is not None:
            return self._caps
        return self._device_capabilities(self._device.index if self._device is not None else 0)

    @property
    def status(self) -> BackendStatus:
        return BackendStatus(
            backend=self.name,
            state=self._state,
            device=str(self._device) if self._device else None,
            generation=self.generation,
            pending_operations=self.pending_operations,
            completed_operations=self.completed_operations,
            # The pool's count, without the memory manager (which a backend in a failure state
            # of its own may refuse): frees are counted when they are made.
            memory_used_bytes=self._pool.info().used
            if self._pool is not None and self.is_ready
            else 0,
            error=self._error,
        )

    @property
    def generation(self) -> int:
        """The pool's generation: it grows each time every handle of the backend goes stale."""
        return self._pool.generation if self._pool is not None else 0

    @property
    def pending_operations(self) -> int:
        """Work submitted and not yet completed, on every stream."""
        return sum(int(s.submitted) - int(s.completed) for s in self._streams)

    @property
    def completed_operations(self) -> int:
        return sum(int(s.completed) for s in self._streams)

    def report_error(self, error: str | None) -> None:
        """Set the error ``status`` shows (a backend's own failure state, in words; None clears
        it)."""
        self._error = error

    def mark_failed(self, reason: str) -> None:
        """Mark the backend failed (every component then raises NotInitializedError saying
        ``reason``); shutdown still releases what it can."""
        self._error = reason
        self._state = LifecycleState.FAILED

    # -- lifecycle --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _one_at_a_time(self) -> AsyncIterator[None]:
        """``initialize`` and ``shutdown`` one after the other: two initializes at once opened
        the device twice (the first was leaked), a shutdown during an initialize returned at
        once (and the backend ended ready), two shutdowns at once closed the device under each
        other. The loop runs them, so a flag and an event serve (no lock bound to a loop)."""
        while self._lifecycle is not None:
            await self._lifecycle.wait()
        done = self._lifecycle = anyio.Event()
        try:
            yield
        finally:
            self._lifecycle = None
            done.set()

    async def initialize(self, device: Device | str | None = None) -> None:
        async with self._one_at_a_time():
            await self._initialize_now(device)

    async def _initialize_now(self, device: Device | str | None) -> None:
        if device is None:
            device = self.selected_device or self._default_device()
        dev = Device.parse(device)
        if self._state is LifecycleState.READY:
            if dev == self._device:
                return
            raise InvalidArgumentError(
                f"backend {self.name!r} is already initialized on {self._device}; shut it down"
                f" before initializing it on {dev}"
            )
        if not self.supports_device(dev):
            raise UnsupportedOperationError(
                f"backend {self.name!r} cannot drive device {dev}; it drives"
                f" {', '.join(sorted(self.device_kinds)) or 'no devices'}"
            )
        # The loop's thread asks Linux for a short time slice, so that it wakes on time while
        # device work keeps every core busy (accelkit._core.sched; ACCELKIT_LOOP_SLICE_US=0
        # turns it off).
        self.loop_thread_scheduling = request_loop_slice()
        # ... and the interpreter hands the GIL to a waiting thread within 1 ms rather than 5
        # (ACCELKIT_SWITCH_INTERVAL_US; an application's own setting is kept).
        self.interpreter_switch_interval = request_switch_interval()
        try:
            opened = await self._initialize(dev)
            self._install(opened)
        except BaseException as exc:
            self._state = LifecycleState.FAILED
            self._error = repr(exc)
            raise
        self._device = dev
        self._error = None
        self._state = LifecycleState.READY

    def _install(self, opened: Opened[S]) -> None:
        from accelkit.ops import KernelOps, MemoryManager, TensorFactory, TensorOps
        from accelkit.sdk.kernels import ComposedOnly

        if not isinstance(opened, Opened):
            raise TypeError(
                f"{type(self).__name__}._initialize must return accelkit.sdk.Opened; got"
                f" {type(opened).__name__}"
            )
        self._retired.update(self._streams)  # a rebuild's old streams (an isolated recover's)
        self._streams = list(opened.streams)
        self._default = self._streams[0]
        self._memory_manager = self._component(MemoryManager, opened.memory)
        self._pool = opened.memory.pool
        self._pool.on_limit = self._on_pool_limit
        self._kernel_executor = opened.executor
        self.supported_dtypes = opened.dtypes
        self._caps = opened.capabilities
        self._tensor_ops = self._component(TensorOps, opened.tensor)
        self._tensor_factory = self._component(TensorFactory, opened.factory)
        fused = opened.fused if opened.fused is not None else ComposedOnly(opened.tensor)
        self._kernel_ops = self._component(KernelOps, fused)

    def _component(self, cls: type[C], kernels: Any) -> C:
        """The component ``cls`` over this session's ``kernels``: the object of an earlier
        session of this backend, initialized anew, where there is one. A reference a program
        kept across ``shutdown`` and a new ``initialize`` (``f = backend.tensor_factory``) then
        serves the new session (it held the old session's kernels: the WebGPU device closed at
        shutdown, an isolated backend's closed worker, where an await hung forever)."""
        old = self._components.get(cls)
        if old is not None:
            old.__init__(self, kernels)  # type: ignore[misc]
            return old  # type: ignore[return-value]
        new = cls(self, kernels)  # type: ignore[call-arg]
        self._components[cls] = new
        return new

    async def reopen(self) -> None:
        """Open the device anew after it was lost: the streams are closed (their queued work is
        abandoned), every tensor, buffer and handle from before becomes stale, and
        ``_initialize`` runs again; the new pool continues the old one's generations, so that
        no old handle can look live. If the device cannot be opened again, the backend is
        marked failed (every component then refuses, saying why) and the error propagates;
        ``shutdown`` still returns."""
        self.check_ready()
        device = self._device
        assert device is not None
        old_pool = self._pool
        for stream in list(self._streams):
            stream.discard_errors()
            await anyio.to_thread.run_sync(stream.close)
        self._retired.update(self._streams)
        self._streams = []
        if old_pool is not None:
            old_pool.invalidate_all(close=True)
        try:
            self._install(await self._initialize(device))
        except BaseException as exc:
            self.mark_failed(f"reopening {device} failed: {exc!r}")
            raise
        if old_pool is not None:
            self.pool.generation = old_pool.generation + 1

    async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
        """Nothing by default (see :meth:`accelkit.abc.ComputeBackend.prepare`): returns None."""
        self.check_ready()
        return None

    async def synchronize(self, device: Device | str | None = None) -> None:
        self.check_ready()
        if self._capture is not None:
            self._capture.refuse("synchronize")
        if device is not None and Device.parse(device) != self._device:
            raise InvalidArgumentError(
                f"backend {self.name!r} runs on {self._device}; cannot synchronize {device}"
            )
        await self._synchronize()

    async def shutdown(self) -> None:
        async with self._one_at_a_time():
            await self._shutdown_now()

    async def _shutdown_now(self) -> None:
        # A backend that opened something (ready, or failed after opening) releases it once.
        if self._state is LifecycleState.SHUT_DOWN or self._memory_manager is None:
            return
        self._closing = True  # no new stream: one opened now would never be closed
        try:
            with anyio.CancelScope(shield=True):
                await self._shutdown()
        finally:
            self._closing = False
            self._state = LifecycleState.SHUT_DOWN
            self._retired.update(self._streams)
            self._streams = []
            self._tensor_ops = self._tensor_factory = None
            self._fallback_ops = None
            self._kernel_executor = self._kernel_ops = None

    # -- graph capture ----------------------------------------------------------------------------
    def capture(self) -> GraphCapture:
        """Record the submissions of an ``async with`` block on the current stream, to replay
        them later as one call: ``async with backend.capture() as graph: ...``, then
        ``graph.replay()`` (a :class:`~accelkit.CapturedGraph`). The block's work runs as usual
        too. Inside it, host reads and waits are refused; shapes and buffers are fixed (see
        docs/execution-model.md, "Graph capture")."""
        from accelkit.capture import GraphCapture

        self.check_ready()
        return GraphCapture(self)

    def _default_device(self) -> Device:
        kinds = sorted(self.device_kinds)
        if not kinds:
            raise UnsupportedOperationError(f"backend {self.name!r} drives no devices")
        return Device(kinds[0], 0)

    def check_ready(self) -> None:
        """Raise NotInitializedError unless the backend is initialized and not shut down. Every
        component entry calls it; a backend with a failure state of its own (a poisoned
        context) extends it to raise that."""
        if self._state is not _READY:
            what = {
                LifecycleState.CREATED: "was never initialized: await backend.initialize(device)",
                LifecycleState.SHUT_DOWN: "was shut down",
                LifecycleState.FAILED: f"failed ({self._error})",
            }.get(self._state, "is not ready")
            raise NotInitializedError(f"backend {self.name!r} {what}")

    # -- components -------------------------------------------------------------------------------
    @property
    def tensor_ops(self) -> TensorOps:
        self.check_ready()
        if self._fallback_ops is not None:
            return self._fallback_ops  # type: ignore[return-value]
        assert self._tensor_ops is not None
        return self._tensor_ops

    def enable_fallback(self, fallback: ComputeBackend) -> FallbackTensorOps:
        from accelkit.fallback import FallbackTensorOps

        self.check_ready()
        if fallback is self or not fallback.is_ready:
            raise InvalidArgumentError(
                "enable_fallback needs another, initialized backend as the fallback"
            )
        assert self._tensor_ops is not None
        self._fallback_ops = FallbackTensorOps(self, self._tensor_ops, fallback)
        return self._fallback_ops

    @property
    def fallback(self) -> FallbackTensorOps | None:
        return self._fallback_ops

    @property
    def tensor_factory(self) -> TensorFactory:
        self.check_ready()
        assert self._tensor_factory is not None
        return self._tensor_factory

    @property
    def memory_manager(self) -> MemoryManager:
        # Reachable after shutdown too, so that memory_info() can show everything was released.
        if self._memory_manager is None:
            self.check_ready()
        assert self._memory_manager is not None
        return self._memory_manager

    @property
    def kernel_executor(self) -> KernelExecutor | None:
        self.check_ready()
        return self._kernel_executor

    @property
    def kernel_ops(self) -> KernelOps:
        self.check_ready()
        assert self._kernel_ops is not None
        return self._kernel_ops

    # -- memory -----------------------------------------------------------------------------------
    @property
    def pool(self) -> CachingPool:
        """The caching pool the backend allocates from (NotInitializedError before
        ``initialize``)."""
        pool = self._pool
        if pool is None:
            raise NotInitializedError(f"backend {self.name!r} has no memory pool before initialize")
        return pool

    @property
    def pool_config(self) -> MemoryPoolConfig:
        """The pool configuration the backend was created with."""
        return self._pool_config

    # -- streams ----------------------------------------------------------------------------------
    def create_stream(self) -> S:
        self.check_ready()
        if self._closing:
            raise NotInitializedError(f"backend {self.name!r} is shutting down: no new stream")
        stream = self._open_stream()
        self._streams.append(stream)
        return stream

    @property
    def streams(self) -> tuple[S, ...]:
        """Every stream of the backend, the default one first (empty outside initialize and
        shutdown)."""
        return tuple(self._streams)

    @property
    def default_stream(self) -> S:
        self.check_ready()
        assert self._default is not None
        return self._default

    @property
    def current_stream(self) -> S:
        s = self._stream_var.get()
        if s is None:
            s = self._default
            assert s is not None, "no stream before initialize"
        return s

    @contextlib.contextmanager
    def use_stream(self, stream: Stream) -> Iterator[Stream]:
        self.check_ready()
        if stream not in self._streams:
            if stream in self._retired:
                raise StaleHandleError(
                    f"{stream!r} is a stream of this {self.name} backend before it was shut down"
                    " or reopened"
                )
            raise InvalidArgumentError(f"{stream!r} is not a stream of this {self.name} backend")
        token = self._stream_var.set(stream)  # one of ours: checked above
        try:
            yield stream
        finally:
            self._stream_var.reset(token)

    def _on_pool_limit(self) -> None:
        """The pool would refuse an allocation over its limit: first wait (blocking this
        thread, as CUDA's caching allocators synchronize before they report out of memory) for
        the work queued on the streams, which keeps alive the buffers of tensors the program may
        have dropped, at most :data:`LIMIT_WAIT_S` in all, then let the streams release them;
        the pool tries once more. Errors of that work stay for their awaits."""
        deadline = time.monotonic() + LIMIT_WAIT_S
        for stream in list(self._streams):
            seq = stream.submitted
            if stream.query():  # (query also marks where a stream's last positions end)
                continue
            done = threading.Event()
            unregister = stream.add_waiter(seq, done.set)
            if not done.wait(max(0.0, deadline - time.monotonic())):
                if unregister is not None:
                    unregister()
                break
        self.prune_streams()

    def prune_streams(self) -> None:
        """Let each stream release what its completed work kept alive (before allocations and
        statistics)."""
        for s in self._streams:
            s.prune()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self._state.value} device={self._device}>"
