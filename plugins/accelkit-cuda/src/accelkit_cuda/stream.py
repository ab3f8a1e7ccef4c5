"""Streams and events on CUDA streams (through CuPy).

A :class:`CUDAStream` wraps one non-blocking ``cupy.cuda.Stream``. Every submission is one
position (``seq``) on it; a tensor records the stream and position of its last writer. Launching
records no event (an event per kernel would cost more host time than the launch): waiting for a
position records an event at that moment, which completes once that position and everything
before it has completed. Where the backend has more than one stream, submissions do record an
event, and keep their tensors alive until it completes, so that a buffer freed on one stream is
never handed to another while a kernel still uses it (see :mod:`accelkit_cuda.memory`).

Waiting never blocks the event loop: ``cudaEventSynchronize`` runs on a worker thread
(``anyio.to_thread``) and the awaiting task resumes when it returns. A cancelled wait abandons the
thread; the device work goes on and is accounted as usual.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import cupy

from accelkit.device import Device
from accelkit.errors import AccelError, InvalidArgumentError
from accelkit.sdk import DeviceErrors, Event, Stream
from accelkit_cuda.errors import translate

__all__ = ["CUDA_ERRORS", "CUDAEvent", "CUDAStream", "wait_event", "wait_event_blocking"]

#: What CuPy raises for a failed CUDA call: runtime API errors, and driver API errors (kernel
#: launches and module loads go through the driver). Both carry the CUDA error code.
CUDA_ERRORS = (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)


OnError = Callable[[AccelError], AccelError]


def _same(error: AccelError) -> AccelError:
    return error


def _usable() -> None:
    """A stream's ``check_usable`` until its backend sets its own (which raises once poisoned)."""


async def wait_event(event: Any, what: str, on_error: OnError = _same) -> None:
    """Wait for a ``cupy.cuda.Event`` without blocking the loop; CUDA errors are translated
    and passed through ``on_error`` (the backend marks itself poisoned there)."""
    try:
        if event.done:
            return
        await anyio.to_thread.run_sync(event.synchronize, abandon_on_cancel=True)
    except CUDA_ERRORS as exc:
        raise on_error(translate(exc, what)) from None


def wait_event_blocking(event: Any, what: str, on_error: OnError = _same) -> None:
    try:
        event.synchronize()
    except CUDA_ERRORS as exc:
        raise on_error(translate(exc, what)) from None


class CUDAStream(DeviceErrors, Stream):
    """One CUDA stream (see the module docstring)."""

    def __init__(self, dev: Device, name: str, on_error: OnError = _same) -> None:
        self.cp = cupy.cuda.Stream(non_blocking=True)
        self.on_error = on_error
        #: Raises ContextPoisonedError once the backend is poisoned (set by the backend).
        self.check_usable: Callable[[], None] = _usable
        self._device = dev
        self.name = name
        self._lock = threading.Lock()
        self.submitted = 0
        self._completed_upto = 0
        #: (seq, event, objects kept alive until it completes): only while tracking.
        self._pending: deque[tuple[int, Any, tuple[Any, ...]]] = deque()
        #: (seq, check): device-side input checks, read from pinned host memory once done.
        self._checks: list[tuple[int, Callable[[], BaseException | None]]] = []
        self.track = False
        #: (event, objects) kept alive for transfers and checks, whatever the tracking.
        self._held: deque[tuple[Any, tuple[Any, ...]]] = deque()

    @property
    def device(self) -> Device:
        return self._device

    def __repr__(self) -> str:
        return f"<CUDAStream {self.name}>"

    # -- submission -------------------------------------------------------------------------------
    def record(self, keepalive: Iterable[Any] = ()) -> int:
        """Count one submission just made on this stream; returns its position."""
        with self._lock:
            self.submitted += 1
            seq = self.submitted
            if self.track:
                try:
                    event = cupy.cuda.Event(disable_timing=True)
                    event.record(self.cp)
                    self._pending.append((seq, event, tuple(keepalive)))
                    self._prune_locked()
                except CUDA_ERRORS as exc:
                    raise self.on_error(translate(exc, f"recording work on {self.name}")) from None
            return seq

    def hold(self, objects: Iterable[Any]) -> Any:
        """Keep ``objects`` (pinned host blocks, device scratch) alive until the work queued so
        far has completed, whoever awaits it or not; returns the event that marks that point."""
        event = self.event_now()
        with self._lock:
            self._held.append((event, tuple(objects)))
            try:
                while self._held and self._held[0][0].done:
                    self._held.popleft()
            except CUDA_ERRORS as exc:
                raise self.on_error(translate(exc, f"work on {self.name}")) from None
        return event

    def event_now(self) -> Any:
        """A fresh event recorded at the current end of the stream."""
        try:
            event = cupy.cuda.Event(disable_timing=True)
            event.record(self.cp)
        except CUDA_ERRORS as exc:
            raise self.on_error(translate(exc, f"recording an event on {self.name}")) from None
        return event

    def prune(self) -> None:
        try:
            with self._lock:
                self._prune_locked()
        except CUDA_ERRORS as exc:
            raise self.on_error(translate(exc, f"work on {self.name}")) from None

    def _prune_locked(self) -> None:
        held = self._held
        while held and held[0][0].done:
            held.popleft()
        pending = self._pending
        while pending and pending[0][1].done:
            self._completed_upto = pending.popleft()[0]
        if not pending and self.cp.done:
            self._completed_upto = self.submitted
        self._prune_checks_locked(self._completed_upto)

    @property
    def completed(self) -> int:
        self.prune()
        return self._completed_upto

    # -- Stream interface -------------------------------------------------------------------------
    def record_event(self) -> CUDAEvent:
        self.check_usable()
        try:
            event = cupy.cuda.Event(disable_timing=False)
            event.record(self.cp)
        except CUDA_ERRORS as exc:
            raise self.on_error(translate(exc, f"recording an event on {self.name}")) from None
        return CUDAEvent(self, event, self.submitted)

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, CUDAEvent):
            raise InvalidArgumentError(
                f"wait_event takes an event of a CUDA stream; got {type(event).__name__}"
            )
        if event.stream.device != self._device:
            raise InvalidArgumentError("wait_event: the event belongs to another device")
        self.check_usable()
        try:
            self.cp.wait_event(event.cp_event)
        except CUDA_ERRORS as exc:
            raise self.on_error(translate(exc, f"waiting for an event on {self.name}")) from None
        self.record((event,))

    def query(self) -> bool:
        self.check_usable()
        try:
            return bool(self.cp.done)
        except CUDA_ERRORS as exc:
            raise self.on_error(translate(exc, f"querying {self.name}")) from None

    async def synchronize(self) -> None:
        self.check_usable()
        seq = self.submitted
        await wait_event(self.event_now(), f"work on {self.name}", self.on_error)
        self.prune()
        self.raise_errors(seq)

    def synchronize_blocking(self) -> None:
        self.check_usable()
        seq = self.submitted
        wait_event_blocking(self.event_now(), f"work on {self.name}", self.on_error)
        self.prune()
        self.raise_errors(seq)

    async def wait_for(self, seq: int) -> None:
        """Wait until position ``seq`` has completed (and whatever was queued after it so far)."""
        self.check_usable()
        if seq > self._completed_upto:
            await wait_event(self.event_now(), f"work on {self.name}", self.on_error)
            self.prune()
        self.raise_errors(seq)

    def wait_for_blocking(self, seq: int) -> None:
        self.check_usable()
        if seq > self._completed_upto:
            wait_event_blocking(self.event_now(), f"work on {self.name}", self.on_error)
            self.prune()
        self.raise_errors(seq)

    def abandon(self) -> None:
        """Forget everything queued (the context is poisoned): no CUDA call is made."""
        with self._lock:
            self._checks = []
            self._pending.clear()
            self._held.clear()
            self._completed_upto = self.submitted

    def close(self) -> None:
        try:
            self.cp.synchronize()
        finally:
            with self._lock:
                self._checks = []
                self._pending.clear()
                self._held.clear()
                self._completed_upto = self.submitted


class CUDAEvent(Event):
    """A CUDA event recorded on a :class:`CUDAStream` (timing enabled)."""

    def __init__(self, stream: CUDAStream, event: Any, seq: int) -> None:
        self._stream = stream
        self.cp_event = event
        self._seq = seq

    @property
    def stream(self) -> CUDAStream:
        return self._stream

    def query(self) -> bool:
        self._stream.check_usable()
        try:
            return bool(self.cp_event.done)
        except CUDA_ERRORS as exc:
            raise self._stream.on_error(
                translate(exc, f"an event on {self._stream.name}")
            ) from None

    async def wait(self) -> None:
        self._stream.check_usable()
        await wait_event(self.cp_event, f"an event on {self._stream.name}", self._stream.on_error)
        self._stream.raise_errors(self._seq)

    def wait_blocking(self) -> None:
        self._stream.check_usable()
        wait_event_blocking(
            self.cp_event, f"an event on {self._stream.name}", self._stream.on_error
        )
        self._stream.raise_errors(self._seq)

    def elapsed_ms(self, end: CUDAEvent) -> float:
        """Milliseconds of device time between this event and ``end``."""
        self.wait_blocking()
        end.wait_blocking()
        try:
            return float(cupy.cuda.get_elapsed_time(self.cp_event, end.cp_event))
        except CUDA_ERRORS as exc:
            raise self._stream.on_error(translate(exc, "timing events")) from None

    def __repr__(self) -> str:
        try:
            state = "done" if self.query() else "pending"
        except AccelError:
            state = "failed"
        return f"<CUDAEvent on {self._stream.name} {state}>"
