"""What device backends with hardware queues share (OpenCL command queues, CUDA streams).

A :class:`QueuedBackend` is a :class:`~accelkit._core.stream_backend.StreamBackend` that also
runs deferred work (returning a freed block to the pool) once a set of device events has
completed: ``after_events`` registers it and ``prune_streams`` runs what is ready, at
allocation, statistics queries and synchronization. A subclass says how many devices there are
(:meth:`_device_count`), what one can do (:meth:`_device_capabilities`) and whether an event has
completed (:meth:`_event_done`).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, Generic

from accelkit._core.stream_backend import S, StreamBackend
from accelkit.memory import MemoryPoolConfig

__all__ = ["QueuedBackend"]


class QueuedBackend(StreamBackend[S], Generic[S]):
    """A backend whose streams are device queues (see the module docstring)."""

    def __init__(self, pool_config: MemoryPoolConfig | None = None) -> None:
        super().__init__(pool_config)
        self._deferred: list[tuple[list[Any], Callable[[], None]]] = []
        self._deferred_lock = threading.Lock()

    @staticmethod
    @abstractmethod
    def _event_done(event: Any) -> bool:
        """Whether a device event has completed (or failed: its error is reported elsewhere)."""

    def after_events(self, events: list[Any], fn: Callable[[], None]) -> None:
        """Run ``fn`` once every event in ``events`` has completed (checked when the streams
        are pruned: at allocation, statistics queries and synchronization)."""
        with self._deferred_lock:
            self._deferred.append((events, fn))

    @property
    def deferred_pending(self) -> bool:
        """Whether work given to :meth:`after_events` still waits for its events (run by the
        next :meth:`prune_streams` that finds them completed)."""
        return bool(self._deferred)

    async def _synchronize(self) -> None:
        await super()._synchronize()
        self.prune_streams()

    def prune_streams(self) -> None:
        """Let each stream release what completed work kept alive, then run the deferred work
        whose events have completed (before allocations, statistics and synchronization)."""
        super().prune_streams()
        if not self._deferred:
            return
        with self._deferred_lock:
            ready = [fn for events, fn in self._deferred if all(map(self._event_done, events))]
            self._deferred = [(ev, fn) for ev, fn in self._deferred if fn not in ready]
        for fn in ready:
            fn()

    async def shutdown(self) -> None:
        try:
            await super().shutdown()
        finally:
            # Blocks whose frees waited for events go with the pool (released at shutdown).
            with self._deferred_lock:
                self._deferred = []
