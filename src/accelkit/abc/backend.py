"""``ComputeBackend``: the facade every backend presents.

The facade owns the lifecycle (``initialize`` / ``synchronize`` / ``shutdown``, all coroutines,
because each may wait for the device) and hands out five components that do the work: TensorOps,
TensorFactory, DeviceMemoryManager, and the optional KernelExecutor and KernelOps. Components are
only reachable between ``initialize`` and ``shutdown``; outside that window every access raises
:class:`~accelkit.errors.NotInitializedError`.

Streams: each backend has a default stream per device; ``create_stream()`` makes more, and
``with backend.use_stream(s):`` sends the work submitted inside the block (in this task: the
setting is a context variable) to ``s``.
"""

from __future__ import annotations

import contextlib
import contextvars
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ClassVar

from accelkit._core.sched import request_loop_slice, request_switch_interval
from accelkit.capabilities import BackendCapabilities, BackendStatus, LifecycleState
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, NotInitializedError, UnsupportedOperationError

if TYPE_CHECKING:
    from accelkit.abc.kernels import KernelExecutor
    from accelkit.abc.memory import DeviceMemoryManager
    from accelkit.abc.stream import Stream
    from accelkit.fallback import FallbackTensorOps
    from accelkit.ops.factory import TensorFactory
    from accelkit.ops.kernel_ops import KernelOps
    from accelkit.ops.tensor_ops import TensorOps
    from accelkit.sdk.kernels import FactoryKernels, FusedKernels, TensorKernels

__all__ = ["ComputeBackend"]


class ComputeBackend(ABC):
    """Base class of every backend (see the module docstring for the contract).

    Subclasses set ``name`` and ``version``, implement ``supports_device``, ``_initialize``,
    ``_synchronize``, ``_shutdown`` and ``create_stream``, and assign the component attributes in
    ``_initialize``.
    """

    name: ClassVar[str] = "abstract"
    version: ClassVar[str] = "0"
    #: Device kinds this backend drives.
    device_kinds: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self._state = LifecycleState.CREATED
        self._device: Device | None = None
        #: The device the selector chose for this backend (``create_backend`` sets it);
        #: ``initialize()`` without an argument opens it.
        self.selected_device: Device | None = None
        self._error: str | None = None
        self._stream_var: contextvars.ContextVar[Stream | None] = contextvars.ContextVar(
            f"accelkit_{self.name}_stream_{id(self)}", default=None
        )
        self.supported_dtypes: frozenset[DType] = frozenset()
        self._tensor_ops: TensorOps | None = None
        self._tensor_factory: TensorFactory | None = None
        self._memory_manager: DeviceMemoryManager | None = None
        self._kernel_executor: KernelExecutor | None = None
        self._kernel_ops: KernelOps | None = None
        self._fallback_ops: FallbackTensorOps | None = None
        #: What ``initialize`` did to the scheduling of the event loop's thread, in words
        #: (``"slice 100 us"``, or why it left the thread alone); None before ``initialize``.
        self.loop_thread_scheduling: str | None = None
        #: What ``initialize`` did to the interpreter's thread switch interval, in words.
        self.interpreter_switch_interval: str | None = None

    # -- identity ---------------------------------------------------------------------------------
    @property
    def device(self) -> Device | None:
        """The device this backend was initialized on (None before ``initialize``)."""
        return self._device

    @property
    def is_ready(self) -> bool:
        return self._state is LifecycleState.READY

    @abstractmethod
    def supports_device(self, device: Device | str) -> bool:
        """Whether this backend can drive ``device`` (cheap; creates no context)."""

    @property
    @abstractmethod
    def capabilities(self) -> BackendCapabilities:
        """What this backend can do on its device (probed if not yet initialized)."""

    @property
    def status(self) -> BackendStatus:
        return BackendStatus(
            backend=self.name,
            state=self._state,
            device=str(self._device) if self._device else None,
            generation=self._generation(),
            pending_operations=self._pending_operations(),
            completed_operations=self._completed_operations(),
            memory_used_bytes=self._memory_manager.memory_info().used
            if self._memory_manager is not None and self.is_ready
            else 0,
            error=self._error,
        )

    def _generation(self) -> int:
        return 0

    def _pending_operations(self) -> int:
        return 0

    def _completed_operations(self) -> int:
        return 0

    # -- lifecycle --------------------------------------------------------------------------------
    async def initialize(self, device: Device | str | None = None) -> None:
        """Open ``device`` (the backend's first device if None) and build the components.

        Initializing a ready backend again on the same device does nothing; on another device it
        raises: shut down first.
        """
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
            await self._initialize(dev)
        except BaseException as exc:
            self._state = LifecycleState.FAILED
            self._error = repr(exc)
            raise
        self._device = dev
        self._error = None
        self._state = LifecycleState.READY

    async def prepare(self, progress: Callable[[str], None] | None = None) -> None:
        """Do now, off the event loop, the one-time device work a backend would otherwise do on
        first need: verifying device-dependent kernel variants, for example (``accelkit
        calibrate`` calls it). ``progress`` receives one line per step. Nothing by default."""
        self._require_ready()

    async def synchronize(self, device: Device | str | None = None) -> None:
        """Wait until all work submitted on every stream of the device has completed.

        Never blocks the event loop; raises the error of a failed operation, if any.
        """
        self._require_ready()
        if device is not None and Device.parse(device) != self._device:
            raise InvalidArgumentError(
                f"backend {self.name!r} runs on {self._device}; cannot synchronize {device}"
            )
        await self._synchronize()

    async def shutdown(self) -> None:
        """Finish pending work, release every byte, and invalidate all tensors and handles.

        Calling it twice, or on a backend never initialized, does nothing.
        """
        if self._state is not LifecycleState.READY:
            return
        try:
            await self._shutdown()
        finally:
            self._state = LifecycleState.SHUT_DOWN
            self._tensor_ops = self._tensor_factory = None
            self._fallback_ops = None
            self._kernel_executor = self._kernel_ops = None

    async def __aenter__(self) -> ComputeBackend:
        if not self.is_ready:
            await self.initialize()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _default_device(self) -> Device:
        kinds = sorted(self.device_kinds)
        if not kinds:
            raise UnsupportedOperationError(f"backend {self.name!r} drives no devices")
        return Device(kinds[0], 0)

    @abstractmethod
    async def _initialize(self, device: Device) -> None: ...

    @abstractmethod
    async def _synchronize(self) -> None: ...

    @abstractmethod
    async def _shutdown(self) -> None: ...

    def _require_ready(self) -> None:
        if self._state is not LifecycleState.READY:
            what = {
                LifecycleState.CREATED: "was never initialized: await backend.initialize(device)",
                LifecycleState.SHUT_DOWN: "was shut down",
                LifecycleState.FAILED: f"failed to initialize ({self._error})",
            }.get(self._state, "is not ready")
            raise NotInitializedError(f"backend {self.name!r} {what}")

    # -- components -------------------------------------------------------------------------------
    @property
    def tensor_ops(self) -> TensorOps:
        self._require_ready()
        if self._fallback_ops is not None:
            return self._fallback_ops  # type: ignore[return-value]
        assert self._tensor_ops is not None
        return self._tensor_ops

    def enable_fallback(self, fallback: ComputeBackend) -> FallbackTensorOps:
        """Run operations this backend refuses on ``fallback`` (an initialized backend), moving
        tensors through the host; returns the wrapper, whose ``events`` and ``counts`` report
        every fallback (see :mod:`accelkit.fallback`)."""
        from accelkit.fallback import FallbackTensorOps

        self._require_ready()
        if fallback is self or not fallback.is_ready:
            raise InvalidArgumentError(
                "enable_fallback needs another, initialized backend as the fallback"
            )
        assert self._tensor_ops is not None
        self._fallback_ops = FallbackTensorOps(self, self._tensor_ops, fallback)
        return self._fallback_ops

    @property
    def fallback(self) -> FallbackTensorOps | None:
        """The fallback wrapper, if :meth:`enable_fallback` was called (its ``events`` and
        ``counts`` report every operation that ran elsewhere)."""
        return self._fallback_ops

    @property
    def tensor_factory(self) -> TensorFactory:
        self._require_ready()
        assert self._tensor_factory is not None
        return self._tensor_factory

    @property
    def memory_manager(self) -> DeviceMemoryManager:
        # Reachable after shutdown too, so that memory_info() can show everything was released.
        if self._memory_manager is None:
            self._require_ready()
        assert self._memory_manager is not None
        return self._memory_manager

    @property
    def kernel_executor(self) -> KernelExecutor | None:
        self._require_ready()
        return self._kernel_executor

    @property
    def kernel_ops(self) -> KernelOps:
        """The fused transformer ops (always present: where the backend has no fused kernel,
        the core's composition runs; see :mod:`accelkit.ops.kernel_ops`)."""
        self._require_ready()
        assert self._kernel_ops is not None
        return self._kernel_ops

    def install_kernels(
        self,
        tensor: TensorKernels,
        factory: FactoryKernels,
        fused: FusedKernels | None = None,
    ) -> None:
        """Build the user-facing TensorOps, TensorFactory and KernelOps over a backend's kernel
        objects (:mod:`accelkit.sdk`); call it from ``_initialize``. Without ``fused``, every
        KernelOps op runs as the core's composition."""
        from accelkit.ops.factory import TensorFactory
        from accelkit.ops.kernel_ops import KernelOps
        from accelkit.ops.tensor_ops import TensorOps
        from accelkit.sdk.kernels import ComposedOnly

        self._tensor_ops = TensorOps(self, tensor)
        self._tensor_factory = TensorFactory(self, factory)
        self._kernel_ops = KernelOps(self, fused if fused is not None else ComposedOnly(tensor))

    # -- streams ----------------------------------------------------------------------------------
    @abstractmethod
    def create_stream(self) -> Stream:
        """A new stream on this backend's device."""

    @property
    @abstractmethod
    def default_stream(self) -> Stream: ...

    @property
    def current_stream(self) -> Stream:
        """The stream work is submitted to in this context (see :meth:`use_stream`)."""
        s = self._stream_var.get()
        return self.default_stream if s is None else s

    @contextlib.contextmanager
    def use_stream(self, stream: Stream) -> Iterator[Stream]:
        """Submit the work of this block (in this thread or task) to ``stream``."""
        self._require_ready()
        self._check_stream(stream)
        token = self._stream_var.set(stream)
        try:
            yield stream
        finally:
            self._stream_var.reset(token)

    @abstractmethod
    def _check_stream(self, stream: Stream) -> None:
        """Raise InvalidArgumentError if ``stream`` is not one of this backend's."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self._state.value} device={self._device}>"
