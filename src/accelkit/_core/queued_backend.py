"""What device backends with hardware queues share (OpenCL command queues, CUDA streams).

A :class:`QueuedBackend` is a :class:`~accelkit._core.stream_backend.StreamBackend` that also
runs deferred work (returning a freed block to the pool) once a set of device events has
completed: ``_after_events`` registers it and ``_prune_streams`` runs what is ready, at
allocation, statistics queries and synchronization. A subclass says how many devices there are
(:meth:`_device_count`), what one can do (:meth:`_device_capabilities`) and whether an event has
completed (:meth:`_event_done`).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from accelkit._core.stream_backend import StreamBackend
from accelkit.memory import MemoryPoolConfig

__all__ = ["QueuedBackend"]


class QueuedBackend(StreamBackend):
    """A backend whose streams are device queues (see the module docstring)."""

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._deferred: list[tuple[list[Any], Callable[[], None]]] = []
        self._deferred_lock = threading.Lock()

    @staticmethod
    @abstractmethod
    def _event_done(event: Any) -> bool:
        """Whether a device event has completed (or failed: its error is reported elsewhere)."""

    def _after_events(self, events: list[Any], fn: Callable[[], None]) -> None:
        """Run ``fn`` once every event in ``events`` has completed (checked when the streams
        are pruned: at allocation, statistics queries and synchronization)."""
        with self._deferred_lock:
            self._deferred.append((events, fn))

    async def _synchronize(self) -> None:
        await super()._synchronize()
        self._prune_streams()

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
