"""``ComputeBackend``: the facade every backend presents (the contract; abstract only).

The facade owns the lifecycle (``initialize`` / ``synchronize`` / ``shutdown``, all coroutines,
because each may wait for the device) and hands out five components that do the work: TensorOps,
TensorFactory, DeviceMemoryManager, and the optional KernelExecutor and KernelOps. Components are
only reachable between ``initialize`` and ``shutdown``; outside that window every access raises
:class:`~accelkit.errors.NotInitializedError`.

Streams: each backend has a default stream per device; ``create_stream()`` makes more, and
``with backend.use_stream(s):`` sends the work submitted inside the block (in this task: the
setting is a context variable) to ``s``.

A backend is written on :class:`accelkit.sdk.StreamBackend`, which implements all of this over
the record its ``_initialize`` returns (:class:`accelkit.sdk.Opened`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from accelkit.abc.kernels import KernelExecutor
    from accelkit.abc.memory import DeviceMemoryManager
    from accelkit.abc.stream import Stream
    from accelkit.capabilities import BackendCapabilities, BackendStatus
    from accelkit.capture import GraphCapture
    from accelkit.device import Device
    from accelkit.dtype import DType
    from accelkit.fallback import FallbackTensorOps
    from accelkit.ops import KernelOps, TensorFactory, TensorOps

__all__ = ["ComputeBackend"]


class ComputeBackend(ABC):
    """What every backend presents to its users (see the module docstring)."""

    name: ClassVar[str] = "abstract"
    version: ClassVar[str] = "0"
    #: Device kinds this backend drives.
    device_kinds: ClassVar[frozenset[str]] = frozenset()

    #: The dtypes this backend's tensors may have on its open device (empty before
    #: ``initialize``).
    supported_dtypes: frozenset[DType]
    #: The device the selector chose for this backend (``create_backend`` sets it);
    #: ``initialize()`` without an argument opens it.
    selected_device: Device | None
    #: What ``initialize`` did to the scheduling of the event loop's thread, in words
    #: (``"slice 100 us"``, or why it left the thread alone); None before ``initialize``.
    loop_thread_scheduling: str | None
    #: What ``initialize`` did to the interpreter's thread switch interval, in words.
    interpreter_switch_interval: str | None

    # -- identity ---------------------------------------------------------------------------------
    @property
    @abstractmethod
    def device(self) -> Device | None:
        """The device this backend was initialized on (None before ``initialize``)."""

    @property
    @abstractmethod
    def is_ready(self) -> bool:
        """Whether the backend is initialized and not shut down (nor failed)."""

    @abstractmethod
    def supports_device(self, device: Device | str) -> bool:
        """Whether this backend can drive ``device`` (cheap; creates no context)."""

    @property
    @abstractmethod
    def capabilities(self) -> BackendCapabilities:
        """What this backend can do on its device (probed if not yet initialized)."""

    @property
    @abstractmethod
    def status(self) -> BackendStatus:
        """The lifecycle state, the work counts, the memory in use and the last error."""

    # -- lifecycle --------------------------------------------------------------------------------
    @abstractmethod
    async def initialize(self, device: Device | str | None = None) -> None:
        """Open ``device`` (the selected one, else the backend's first device, if None) and
        build the components. A public boundary: a string (``"cuda:1"``) is parsed here, once;
        the backend's hooks receive the :class:`~accelkit.Device`.

        Initializing a ready backend again on the same device does nothing; on another device it
        raises: shut down first.
        """

    @abstractmethod
    async def prepare(self, progress: Callable[[str], None] | None = None) -> str | None:
        """Do now, off the event loop, the one-time device work a backend would otherwise do on
        first need (verifying device-dependent kernel variants, warming a JIT); ``accelkit
        calibrate`` and the self-test of ``accelkit doctor`` call it. ``progress`` receives one
        line per step.

        Returns None when everything is prepared, else a note on what could not be and why (a
        JIT kernel left out, whose NumPy code runs instead): the backend still works, with
        less; ``accelkit doctor`` shows the note."""

    @abstractmethod
    async def synchronize(self, device: Device | str | None = None) -> None:
        """Wait until all work submitted on every stream of the device has completed.

        Never blocks the event loop; raises the error of a failed operation, if any.
        """

    @abstractmethod
    async def shutdown(self) -> None:
        """Finish pending work, release every byte, and invalidate all tensors and handles.

        Calling it twice, or on a backend never initialized, does nothing.
        """

    async def __aenter__(self) -> ComputeBackend:
        if not self.is_ready:
            await self.initialize()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def capture(self) -> GraphCapture:
        """Record the submissions of an ``async with`` block to replay them as one call (see
        docs/execution-model.md, "Graph capture"); UnsupportedOperationError on a backend that
        does not derive from ``accelkit.sdk.StreamBackend``."""
        from accelkit.errors import UnsupportedOperationError

        raise UnsupportedOperationError(f"backend {self.name!r} has no graph capture")

    # -- components -------------------------------------------------------------------------------
    @property
    @abstractmethod
    def tensor_ops(self) -> TensorOps:
        """The operations (the fallback wrapper's, once :meth:`enable_fallback` was called)."""

    @property
    @abstractmethod
    def tensor_factory(self) -> TensorFactory:
        """Tensor creation: fills, ranges, random numbers, host copies."""

    @property
    @abstractmethod
    def memory_manager(self) -> DeviceMemoryManager:
        """Raw buffers, transfers and memory statistics (reachable after shutdown too, so that
        ``memory_info()`` can show that everything was released)."""

    @property
    @abstractmethod
    def kernel_executor(self) -> KernelExecutor | None:
        """Compiles and launches user kernels; None where the backend has none."""

    @property
    @abstractmethod
    def kernel_ops(self) -> KernelOps:
        """The fused transformer ops (always present: where the backend has no fused kernel,
        the core's composition runs; see :mod:`accelkit.ops.kernel_ops`)."""

    @abstractmethod
    def enable_fallback(self, fallback: ComputeBackend) -> FallbackTensorOps:
        """Run operations this backend refuses on ``fallback`` (an initialized backend), moving
        tensors through the host; returns the wrapper, whose ``events`` and ``counts`` report
        every fallback (see :mod:`accelkit.fallback`)."""

    @property
    @abstractmethod
    def fallback(self) -> FallbackTensorOps | None:
        """The fallback wrapper, if :meth:`enable_fallback` was called."""

    # -- streams ----------------------------------------------------------------------------------
    @abstractmethod
    def create_stream(self) -> Stream:
        """A new stream on this backend's device."""

    @property
    @abstractmethod
    def default_stream(self) -> Stream:
        """The stream work goes to outside :meth:`use_stream`."""

    @property
    @abstractmethod
    def current_stream(self) -> Stream:
        """The stream work is submitted to in this context (see :meth:`use_stream`)."""

    @abstractmethod
    def use_stream(self, stream: Stream) -> contextlib.AbstractContextManager[Stream]:
        """Submit the work of this block (in this thread or task) to ``stream``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} device={self.device}>"
