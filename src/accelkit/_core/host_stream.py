"""Streams whose work runs on a host thread: the CPU backend's streams.

Each stream has one worker thread (started on first use), so work on a stream runs in submission
order and never on the event loop's thread. Small work submitted while the stream is idle runs
inline on the submitting thread instead: nothing is queued ahead of it, so order is kept, and it
skips the hand-off to the worker (tens of microseconds), which would dwarf a small operation.

Positions in a stream are sequence numbers: ``submitted`` counts what was submitted, ``completed``
what has finished. A tensor records the number of the operation that wrote it; waiting for a tensor
is waiting until ``completed`` reaches that number.
"""

from __future__ import annotations

import atexit
import importlib
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from accelkit._core.device_errors import drop_tracebacks, note_others, pick_errors
from accelkit._core.positions import PositionEvent, PositionStream, Waiters
from accelkit.abc.stream import Event
from accelkit.device import Device
from accelkit.errors import AccelError, DeviceError, InvalidArgumentError, StaleHandleError

__all__ = ["HostEvent", "HostStream", "errors_ignored"]


class HostStream(PositionStream):
    """A stream backed by one worker thread (see the module docstring)."""

    submitted: int
    completed: int

    def __init__(self, device: Device, name: str = "stream") -> None:
        self._device = device
        self.name = name
        # One lock guards the counters; the condition on it is only notified when a thread is
        # actually blocked on it (`_blocked`), which keeps the inline path to one lock round trip.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._blocked = 0
        self._queue: deque[tuple[int, Callable[[], None], object]] = deque()
        self.submitted = 0
        self.completed = 0
        self._waiters = Waiters(self._lock)
        self._thread: threading.Thread | None = None
        #: (position, error, position of the await that named it in a note, or None)
        self._errors: list[tuple[int, BaseException, int | None]] = []
        self._closed = False
        #: Set at the interpreter's exit (:func:`_stop_at_exit`): the queued work was dropped.
        self._dropped = False

    @property
    def device(self) -> Device:
        return self._device

    def __repr__(self) -> str:
        return (
            f"HostStream({self.name!r}, device={self._device}, submitted={self.submitted},"
            f" completed={self.completed})"
        )

    # -- submission -------------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[], None],
        heavy: bool,
        deps: Sequence[tuple[HostStream, int]] = (),
        hold: object = None,
    ) -> int:
        """Run ``fn`` after everything submitted before it; returns its sequence number.

        ``deps`` are (stream, seq) positions on other streams that must complete first.
        ``hold`` is kept alive until ``fn`` has run: the tensors it reads and writes, whose
        buffers would otherwise go back to the pool, and to work on another stream, while
        ``fn`` still waits in the queue with only their arrays.
        """
        with self._lock:
            if self._closed:
                raise StaleHandleError(
                    f"{self!r}: the stream was closed (its backend was shut down)"
                )
            seq = self.submitted + 1
            self.submitted = seq
            if not heavy and not deps and self.completed == seq - 1:
                # Inline: the stream is idle, so running here keeps submission order. It runs
                # under the lock (small work, by the caller's estimate): a submission from another
                # thread meanwhile waits, then queues behind it. No waiter can be registered for
                # a position that did not exist a moment ago, so none is due.
                quiet = _np_errstate.set(_QUIET)  # no NumPy warnings (see the end)
                interrupt: BaseException | None = None
                try:
                    fn()
                except (KeyboardInterrupt, SystemExit) as exc:
                    # The program's interrupt (Ctrl-C lands on the thread that runs the op
                    # inline), not the op's failure: raised here, at once (it came back as a
                    # DeviceError at the next await); the op's position fails, saying so, in
                    # case it wrote into a tensor the program holds.
                    interrupt = exc
                    self._errors.append((seq, DeviceError(f"{self.name}: an operation was"
                                         f" interrupted ({type(exc).__name__})"), None))  # fmt: skip
                except BaseException as exc:
                    self._errors.append((seq, exc, None))
                finally:
                    _np_errstate.reset(quiet)
                self.completed = seq
                if self._blocked:
                    self._cv.notify_all()
                if interrupt is not None:
                    raise interrupt
                return seq
            if deps:
                fn = _after(deps, fn)
            self._queue.append((seq, fn, hold))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name=f"accelkit-{self.name}", daemon=True
                )
                _RUNNING.add(self)
                self._thread.start()
            elif self._blocked:
                self._cv.notify_all()
            return seq

    def _wait_locked(self) -> None:
        self._blocked += 1
        try:
            self._cv.wait()
        finally:
            self._blocked -= 1

    def _work(self) -> None:
        # Kernels follow accelkit's special-value rules (NaN and inf results, no warnings):
        # NumPy's floating-point error state is per thread, so this thread's is set once.
        if _QUIET is not None:
            _np_errstate.set(_QUIET)  # the same state as inline work: errors_ignored() sees it
        else:  # pragma: no cover - a NumPy without the context variable
            np.seterr(all="ignore")
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wait_locked()
                if not self._queue:
                    return
                seq, fn, hold = self._queue.popleft()
                while self.completed < seq - 1:
                    self._wait_locked()
            try:
                fn()
            except BaseException as exc:
                self._errors.append((seq, exc, None))
            del fn, hold  # drop the closure and the buffers held before marking completion
            self._finish(seq)

    def _finish(self, seq: int) -> None:
        with self._lock:
            self.completed = seq
            if self._blocked:
                self._cv.notify_all()
            if not self._waiters:
                return
            ready = self._waiters.due(seq)
        for callback in ready:
            callback()

    # -- waiting ----------------------------------------------------------------------------------
    def add_waiter(self, seq: int, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (from any thread) once ``completed >= seq``; returns an unregister."""
        return self._waiters.add(seq, callback, lambda: self.completed)

    def wait_for_blocking(self, seq: int) -> None:
        with self._lock:
            while self.completed < seq:
                self._wait_locked()
        self.raise_errors(seq)

    def discard_errors(self) -> None:
        self._errors.clear()

    def raise_errors(self, seq: int) -> None:
        """Raise (once) the error of the first failed operation at or before ``seq``, with the
        other failures at or before it as notes (``device_errors.pick_errors``: they were
        raised by the next await of later, valid work)."""
        if not self._errors:
            return
        with self._lock:
            picked, others, self._errors[:] = pick_errors(self._errors, seq)
            if picked is None:
                return
        error: BaseException | None = None
        try:
            if isinstance(picked, AccelError):
                error = picked
            else:
                error = DeviceError(
                    f"an operation on {self.name} ({self._device}) failed: {picked!r}"
                )
                error.__cause__ = picked
            note_others(error, others)
            raise error
        finally:
            # Break the cycle error -> traceback -> this frame -> error, which would keep the
            # failed kernel's tensors (and their device memory) alive until a gc pass.
            del error, picked, others

    # -- Stream interface -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:  # as a submission (an event of a closed stream marked nothing)
            raise StaleHandleError(f"{self!r}: the stream was closed (its backend was shut down)")

    def record_event(self) -> HostEvent:
        self._check_open()
        return HostEvent(self, self.submitted)

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, HostEvent):
            raise InvalidArgumentError(
                f"expected an event of a host stream; got {type(event).__name__}"
            )
        self._check_open()
        if event.query() or event.stream is self:
            return
        self.submit(lambda: None, heavy=True, deps=[(event.stream, event.seq)])

    def close(self) -> None:
        """Let queued work finish, then stop the worker thread (called by shutdown)."""
        _RUNNING.discard(self)
        with self._lock:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        # Errors stay (an await woken by the last work may not have taken its own yet), but not
        # their tracebacks: the kernels' frames would keep their tensors, and so their memory,
        # for as long as the stream object lives.
        with self._lock:
            for _, exc, _at in self._errors:
                drop_tracebacks(exc)


#: The streams whose worker thread was started and that were not closed since.
_RUNNING: weakref.WeakSet[HostStream] = weakref.WeakSet()

#: How long the exit waits for each stream's running operation.
_EXIT_JOIN_S = 60.0


@atexit.register
def _stop_at_exit() -> None:
    """At the interpreter's exit, the streams a program left open (no ``shutdown()``, or an
    exception) drop the work still queued and stop once the running operation ends: a worker
    thread still in BLAS while the interpreter finalized hung the exit for good (a CPU backend
    with three products of 2048 queued never exited)."""
    streams = list(_RUNNING)
    for stream in streams:  # all of them first: work on one may wait for another's (_after)
        with stream._lock:
            stream._closed = stream._dropped = True
            stream._queue.clear()  # nobody is left to await it
            stream._cv.notify_all()
    for stream in streams:
        thread = stream._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_EXIT_JOIN_S)


def _after(deps: Sequence[tuple[HostStream, int]], fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for stream, seq in deps:
            with stream._lock:
                while stream.completed < seq:
                    if stream._dropped:  # at exit: that position will never complete
                        return
                    stream._wait_locked()
        fn()

    return run


class HostEvent(PositionEvent[HostStream]):
    """A position in a :class:`HostStream`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"HostEvent({self._stream.name!r}, seq={self.seq}, done={self.query()})"


# NumPy's floating-point error state lives in a context variable (NumPy 2): setting it around an
# inline kernel costs about 0.1 us, where ``np.errstate`` costs about 1.3 us on every small op.
class _ErrstateVar:  # pragma: no cover - the fallback for a NumPy without that variable
    """``set``/``reset`` over ``np.errstate``, for a NumPy without the context variable."""

    def set(self, value: object) -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def reset(self, token: Any) -> None:
        token.__exit__(None, None, None)


def _errstate_var() -> Any:
    try:
        config = importlib.import_module("numpy._core._ufunc_config")
    except ImportError:  # pragma: no cover
        return _ErrstateVar()
    return getattr(config, "_extobj_contextvar", None) or _ErrstateVar()


_np_errstate: Any = _errstate_var()
with np.errstate(all="ignore"):
    _QUIET = None if isinstance(_np_errstate, _ErrstateVar) else _np_errstate.get()


def errors_ignored() -> bool:
    """True when NumPy's floating-point error state is the one streams set around their work
    (every error ignored): a kernel body then needs no ``np.errstate`` of its own (about
    1.5 us a call)."""
    return _QUIET is not None and _np_errstate.get() is _QUIET
