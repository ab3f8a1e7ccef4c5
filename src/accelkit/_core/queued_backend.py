"""What device backends with hardware queues share (OpenCL command queues, CUDA streams).

A :class:`QueuedBackend` keeps its streams in ``_streams`` (the default first), answers
``supports_device`` from a device count, and runs deferred work (returning a freed block to the
pool) once a set of device events has completed: ``_after_events`` registers it and
``_prune_streams`` runs what is ready, at allocation, statistics queries and synchronization.
A subclass says how many devices there are (:meth:`_device_count`), what one can do
(:meth:`_device_capabilities`) and whether an event has completed (:meth:`_event_done`).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from accelkit.abc.backend import ComputeBackend
from accelkit.abc.stream import Stream
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import DeviceError, InvalidArgumentError

__all__ = ["QueuedBackend"]


class QueuedBackend(ComputeBackend):
    """A backend whose streams are device queues (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: Every stream of the backend, the default one first.
        self._streams: list[Any] = []
        self._default: Any = None
        self._caps: BackendCapabilities | None = None
        self._deferred: list[tuple[list[Any], Callable[[], None]]] = []
        self._deferred_lock = threading.Lock()

    # -- devices ----------------------------------------------------------------------------------
    @abstractmethod
    def _device_count(self) -> int:
        """How many devices of this kind there are; DeviceError saying why there are none."""

    @abstractmethod
    def _device_capabilities(self, index: int) -> BackendCapabilities:
        """The capabilities of device ``index`` (without initializing the backend)."""

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        if d.kind not in self.device_kinds:
            return False
        try:
            return d.index < self._device_count()
        except DeviceError:
            return False

    @property
    def capabilities(self) -> BackendCapabilities:
        if self._caps is not None:
            return self._caps
        return self._device_capabilities(self._device.index if self._device is not None else 0)

    # -- streams ----------------------------------------------------------------------------------
    @property
    def default_stream(self) -> Stream:
        self._require_ready()
        assert self._default is not None
        return self._default  # type: ignore[no-any-return]

    def _check_stream(self, stream: Stream) -> None:
        if stream not in self._streams:
            raise InvalidArgumentError(f"{stream!r} is not a stream of this {self.name} backend")

    @staticmethod
    @abstractmethod
    def _event_done(event: Any) -> bool:
        """Whether a device event has completed (or failed: its error is reported elsewhere)."""

    def _after_events(self, events: list[Any], fn: Callable[[], None]) -> None:
        """Run ``fn`` once every event in ``events`` has completed (checked when the streams
        are pruned: at allocation, statistics queries and synchronization)."""
        with self._deferred_lock:
            self._deferred.append((events, fn))

    def _prune_streams(self) -> None:
        for s in self._streams:
            s.prune()
        if not self._deferred:
            return
        with self._deferred_lock:
            ready = [fn for events, fn in self._deferred if all(map(self._event_done, events))]
            self._deferred = [(ev, fn) for ev, fn in self._deferred if fn not in ready]
        for fn in ready:
            fn()

    def _forget_deferred(self) -> None:
        with self._deferred_lock:
            self._deferred = []

    def _pending_operations(self) -> int:
        return sum(s.submitted - s.completed for s in self._streams)

    def _completed_operations(self) -> int:
        return sum(int(s.completed) for s in self._streams)
