"""Streams and events on OpenCL command queues.

A :class:`CLStream` is one in-order command queue (profiling enabled). Every submission is one
position (``seq``) in the stream and ends in one OpenCL event; a tensor records the stream and
position of its last writer, so a transfer waits for exactly that event. Until an event has
completed the stream keeps the objects its command uses (buffers, host arrays) alive, which is
what keeps a pooled buffer from being handed out again while a kernel still reads it.

Waiting never blocks the event loop: the waiter registers an OpenCL completion callback
(``clSetEventCallback``), which wakes the loop from the driver's thread; where callbacks are not
supported the wait runs on a worker thread instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import pyopencl as cl

from accelkit._core.device_errors import DeviceErrors
from accelkit._core.loop import wait_for_callback
from accelkit.abc.stream import Event, Stream
from accelkit.device import Device
from accelkit.errors import DeviceError, InvalidArgumentError

__all__ = ["CLEvent", "CLStream", "wait_cl_event", "wait_cl_event_blocking"]

_COMPLETE = cl.command_execution_status.COMPLETE


def _status(event: Any) -> int:
    return int(event.command_execution_status)


def _check(event: Any, what: str) -> None:
    status = _status(event)
    if status < 0:
        raise DeviceError(f"OpenCL reported error {status} for {what}")


async def wait_cl_event(event: Any, queue: Any, what: str = "a command") -> None:
    """Wait for an OpenCL event without blocking the event loop."""
    if _status(event) != _COMPLETE:
        queue.flush()  # a command the queue has not sent to the device would never complete

        def register(callback: Callable[[], None]) -> Callable[[], None] | None:
            fired = threading.Event()

            def on_complete(status: int) -> None:
                if not fired.is_set():
                    fired.set()
                    callback()

            try:
                event.set_callback(_COMPLETE, on_complete)
            except (cl.Error, AttributeError, NotImplementedError):
                # No callbacks (OpenCL 1.0 or a driver that refuses them): a worker thread waits.
                def wait_then_call() -> None:
                    event.wait()
                    on_complete(0)

                threading.Thread(target=wait_then_call, daemon=True).start()
            # An OpenCL callback cannot be withdrawn; a cancelled waiter just ignores it.
            return None

        await wait_for_callback(register)
    _check(event, what)


def wait_cl_event_blocking(event: Any, queue: Any, what: str = "a command") -> None:
    queue.flush()
    event.wait()
    _check(event, what)


class CLStream(DeviceErrors, Stream):
    """One in-order OpenCL command queue (see the module docstring)."""

    def __init__(self, context: Any, device: Any, dev: Device, name: str) -> None:
        self.queue = cl.CommandQueue(
            context, device, properties=cl.command_queue_properties.PROFILING_ENABLE
        )
        self._device = dev
        self.name = name
        self._lock = threading.Lock()
        self.submitted = 0
        self._completed_upto = 0
        #: seq -> (event, objects kept alive until the event completes), oldest first
        self._pending: OrderedDict[int, tuple[Any, tuple[Any, ...]]] = OrderedDict()
        #: (seq, check) of commands that can fail on the device (an index out of range): once
        #: position seq has completed, check() returns the error to raise, or None.
        self._checks: list[tuple[int, Callable[[], BaseException | None]]] = []

    @property
    def device(self) -> Device:
        return self._device

    def __repr__(self) -> str:
        return f"<CLStream {self.name}>"

    # -- submission -------------------------------------------------------------------------------
    def record(self, event: Any, keepalive: Iterable[Any] = ()) -> int:
        """Record ``event`` (just enqueued on this queue) as the stream's next position."""
        with self._lock:
            self._prune_locked()
            self.submitted += 1
            seq = self.submitted
            self._pending[seq] = (event, tuple(keepalive))
            return seq

    def event_for(self, seq: int) -> Any | None:
        """The OpenCL event of position ``seq``, or None once it has completed."""
        with self._lock:
            if seq <= self._completed_upto:
                return None
            entry = self._pending.get(seq)
            if entry is None:
                return None
            if _status(entry[0]) == _COMPLETE:
                self._prune_locked()
                return None
            return entry[0]

    def last_event(self) -> Any | None:
        with self._lock:
            self._prune_locked()
            if not self._pending:
                return None
            return next(reversed(self._pending.values()))[0]

    def prune(self) -> None:
        """Drop the keep-alive references of completed commands (their buffers may be reused)."""
        with self._lock:
            self._prune_locked()

    def _prune_locked(self) -> None:
        pending = self._pending
        while pending:
            seq, (event, _) = next(iter(pending.items()))
            status = _status(event)
            if status != _COMPLETE and status >= 0:
                break
            # A failed command (status < 0) is dropped too: its error is seen by the waiters.
            pending.popitem(last=False)
            self._completed_upto = seq
        # Commands that completed without an error need no check any more.
        self._prune_checks_locked(self._completed_upto)

    @property
    def completed(self) -> int:
        self.prune()
        return self._completed_upto

    # -- Stream interface -------------------------------------------------------------------------
    def record_event(self) -> CLEvent:
        marker = cl.enqueue_marker(self.queue)
        self.record(marker)
        return CLEvent(self, marker)

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, CLEvent):
            raise InvalidArgumentError(
                f"wait_event takes an event of an OpenCL stream; got {type(event).__name__}"
            )
        if event.stream.queue.context != self.queue.context:
            raise InvalidArgumentError("wait_event: the event belongs to another OpenCL context")
        if event.query():
            return
        # A barrier with a wait list: later commands of this queue start after the event.
        barrier = cl.enqueue_barrier(self.queue, wait_for=[event.cl_event])
        self.record(barrier, (event,))

    def query(self) -> bool:
        return self.completed >= self.submitted

    async def synchronize(self) -> None:
        seq = self.submitted
        event = self.last_event()
        if event is not None:
            await wait_cl_event(event, self.queue, f"work on {self.name}")
        self.prune()
        self.raise_errors(seq)

    def synchronize_blocking(self) -> None:
        seq = self.submitted
        event = self.last_event()
        if event is not None:
            wait_cl_event_blocking(event, self.queue, f"work on {self.name}")
        self.prune()
        self.raise_errors(seq)

    async def wait_for(self, seq: int) -> None:
        """Wait until position ``seq`` has completed."""
        event = self.event_for(seq)
        if event is not None:
            await wait_cl_event(event, self.queue, f"work on {self.name}")
        self.raise_errors(seq)

    def wait_for_blocking(self, seq: int) -> None:
        event = self.event_for(seq)
        if event is not None:
            wait_cl_event_blocking(event, self.queue, f"work on {self.name}")
        self.raise_errors(seq)

    def close(self) -> None:
        self.queue.finish()
        with self._lock:
            self._checks = []
            self._pending.clear()
            self._completed_upto = self.submitted


class CLEvent(Event):
    """An OpenCL marker event on a :class:`CLStream`."""

    def __init__(self, stream: CLStream, event: Any) -> None:
        self._stream = stream
        self.cl_event = event

    @property
    def stream(self) -> CLStream:
        return self._stream

    def query(self) -> bool:
        status = _status(self.cl_event)
        if status < 0:
            return True
        return status == _COMPLETE

    async def wait(self) -> None:
        await wait_cl_event(self.cl_event, self._stream.queue, f"an event on {self._stream.name}")

    def wait_blocking(self) -> None:
        wait_cl_event_blocking(
            self.cl_event, self._stream.queue, f"an event on {self._stream.name}"
        )

    def elapsed_ms(self, end: CLEvent) -> float:
        """Milliseconds between this event and ``end`` (the queues profile their commands)."""
        self.wait_blocking()
        end.wait_blocking()
        return float(end.cl_event.profile.end - self.cl_event.profile.end) / 1e6

    def __repr__(self) -> str:
        return f"<CLEvent on {self._stream.name} {'done' if self.query() else 'pending'}>"
