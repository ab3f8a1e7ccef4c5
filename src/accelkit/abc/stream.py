"""Streams and events: the ordering contract every backend keeps.

A :class:`Stream` is an ordered queue of device work. Work submitted to one stream runs in
submission order; work on different streams may overlap. An :class:`Event` marks a point in a
stream: it completes once everything submitted to that stream before it has completed. Another
stream can wait for it (``wait_event``), which orders work across streams without blocking the host.

Waiting on the host is always a coroutine (``await event.wait()``, ``await stream.synchronize()``)
so that an event loop is never blocked by device work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from accelkit.device import Device

__all__ = ["Event", "Stream"]


class Event(ABC):
    """A point in a stream's work (from :meth:`Stream.record_event`)."""

    @property
    @abstractmethod
    def stream(self) -> Stream:
        """The stream the event was recorded on."""

    @abstractmethod
    def query(self) -> bool:
        """True once every operation submitted before the event has completed (never blocks)."""

    @abstractmethod
    async def wait(self) -> None:
        """Wait for the event without blocking the event loop.

        Cancelling the waiting task only stops the wait; the device work goes on.
        Raises the error of a failed operation submitted before the event, if any.
        """

    @abstractmethod
    def wait_blocking(self) -> None:
        """Blocking twin of :meth:`wait`, for threads and scripts."""


class Stream(ABC):
    """An ordered queue of device work on one device."""

    @property
    @abstractmethod
    def device(self) -> Device: ...

    @abstractmethod
    def record_event(self) -> Event:
        """Mark the current end of this stream's queue."""

    @abstractmethod
    def wait_event(self, event: Event) -> None:
        """Make work submitted to this stream after this call wait for ``event``.

        Returns at once: the wait happens on the device (or the stream's worker), never on the host.
        """

    @abstractmethod
    def query(self) -> bool:
        """True when everything submitted to this stream has completed."""

    @abstractmethod
    async def synchronize(self) -> None:
        """Wait until everything submitted so far has completed, without blocking the loop."""
