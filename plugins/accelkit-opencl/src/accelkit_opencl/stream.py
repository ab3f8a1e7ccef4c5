"""Streams and events on OpenCL command queues, with every OpenCL call off the event loop.

A :class:`CLStream` is one in-order command queue (profiling enabled). Every submission is one
position (``seq``) in the stream; a tensor records the stream and position of its last writer, so
a transfer waits for exactly that position.

**Submitting** (:meth:`CLStream.submit`) costs the caller no OpenCL call: it takes the next
position, keeps the command's objects (buffers, host arrays, the closure itself) alive and queues
the closure ``fn(queue, wait_for) -> event`` for the stream's *submitter* thread, which runs the
closures in submission order. That is where internal kernels are built (on first use), arguments
are set, commands are enqueued and the queue is flushed. A dependency on another stream is given
as a position there (``(stream, seq)``); the submitter waits until that stream's submitter has
enqueued it and passes its event in the wait list (dependencies always point to earlier
submissions, so the threads cannot wait on each other in a cycle). A closure that raises (a
kernel that fails to build, an OpenCL error) does not stop the thread: its position gets no
command, and its error, as an accelkit error (a ``KernelCompileError`` as it is, anything else a
``DeviceError``), is raised by the next await that covers that position, like the errors that
kernels find on the device (:class:`~accelkit.sdk.DeviceErrors`).

**Completion** is followed by the stream's *completer* thread, which waits for the positions'
events in order, drops what each kept alive (so the pool may hand its buffers out again), notes
failed commands, and wakes waiters: an ``await`` registers a callback that the completer calls,
which wakes the loop through its own thread-safe entry point
(:func:`~accelkit.sdk.wait_for_callback`). Waiting is pure Python on the loop's thread;
blocking waits (``synchronize_blocking``, ``numpy()``) wait on a condition.

A position of another stream that a command depends on is complete on this stream's side only
once that stream's completer has seen it too, so completion reads the same from every stream.

Code that enqueues on :attr:`CLStream.queue` itself asks for events with
:meth:`CLStream.event_for` / :meth:`CLStream.last_event`, which never wait: a command's event once
the submitter has enqueued it, before that a user event that the completer sets.

Both threads start with the stream's first submission, end after a while without work (the next
submission starts them again), and stop in :meth:`CLStream.close` (after the queued work has
finished).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import anyio
import pyopencl as cl

from accelkit.device import Device
from accelkit.errors import AccelError, DeviceError, InvalidArgumentError, StaleHandleError
from accelkit.sdk import (
    DeviceErrors,
    Event,
    PositionEvent,
    PositionStream,
    Waiters,
    wait_for_callback,
)

__all__ = [
    "CLEvent",
    "CLStream",
    "Enqueue",
    "Position",
    "as_accel_error",
    "cl_errors",
    "wait_cl_event",
    "wait_cl_event_blocking",
]

_COMPLETE = cl.command_execution_status.COMPLETE
_QUEUED = cl.command_execution_status.QUEUED

#: ``fn(queue, wait_for) -> event``: enqueues one command (or several, returning the last one's
#: event; None when it enqueued nothing). Runs on the stream's submitter thread.
Enqueue = Callable[[Any, list[Any] | None], Any]

#: How long :meth:`CLStream.close` waits for each of the stream's threads.
_JOIN_TIMEOUT = 60.0

#: A stream's threads end after this long without work (seconds); the next submission starts
#: them again. (A backend dropped without shutdown leaves no thread behind for long.)
_IDLE_EXIT = 10.0

#: The submitter flushes the queue when it has nothing more to enqueue, and at least this often.
_FLUSH_EVERY = 32

_log = logging.getLogger("accelkit.opencl")

#: The streams not yet closed: a program that ends without ``shutdown()`` (or dies of an
#: exception) with work still queued has them closed at exit (:func:`_close_at_exit`).
_OPEN: weakref.WeakSet[CLStream] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close the streams left open, before the interpreter finalizes: their threads waited
    in the OpenCL driver for queued commands then, and the process aborted ("terminate called
    without an active exception", status 134)."""
    for stream in list(_OPEN):
        try:
            stream.close()
        except Exception as exc:  # a broken device: the exit goes on
            _log.warning("accelkit-opencl: closing %s at exit failed: %s", stream.name, exc)


def _status(event: Any) -> int:
    return int(event.command_execution_status)


def _strip(exc: BaseException) -> BaseException:
    """Drop the tracebacks along ``exc``'s chain: they hold the failed closure's frames (and so
    its tensors) for as long as the error waits to be reported."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


def as_accel_error(exc: BaseException, where: str) -> AccelError:
    """``exc`` (raised by a command's closure) as the accelkit error to report."""
    _strip(exc)
    if isinstance(exc, AccelError):
        return exc
    if isinstance(exc, cl.Error):
        error = DeviceError(f"OpenCL error in work on {where}: {exc}")
    else:
        error = DeviceError(f"an operation on {where} failed: {exc!r}")
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def cl_errors(where: str) -> Iterator[None]:
    """For OpenCL calls made on the caller's thread (creating queues, events, buffers; asking
    a kernel's limits): a PyOpenCL error comes out as the accelkit error to report, never
    raw."""
    try:
        yield
    except cl.Error as exc:
        raise as_accel_error(exc, where) from exc


class _Failure:
    """The check of a position whose command failed: returns its error until it is taken."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error: BaseException | None = error

    def __call__(self) -> BaseException | None:
        return self.error


class _Work:
    __slots__ = ("deps", "fn", "hook", "seq")

    def __init__(
        self,
        seq: int,
        fn: Enqueue,
        deps: Sequence[tuple[CLStream, int]],
        hook: Callable[[Any], None] | None,
    ) -> None:
        self.seq = seq
        self.fn = fn
        self.deps = deps
        self.hook = hook


class Position:
    """A position of a stream, as a device event would be asked about it: ``done`` and
    ``command_execution_status`` (COMPLETE once done) answer from the stream's own counters,
    without an OpenCL call (the backend's deferred frees poll these)."""

    __slots__ = ("seq", "stream")

    def __init__(self, stream: CLStream, seq: int) -> None:
        self.stream = stream
        self.seq = seq

    @property
    def done(self) -> bool:
        return self.stream.completed >= self.seq

    @property
    def command_execution_status(self) -> int:
        return int(_COMPLETE if self.done else _QUEUED)

    def __repr__(self) -> str:
        return f"<Position {self.seq} of {self.stream.name}{' done' if self.done else ''}>"


class CLStream(DeviceErrors, PositionStream):
    """One in-order OpenCL command queue fed by its own thread (see the module docstring)."""

    #: Positions handed out / completed (plain attributes: read on every launch).
    submitted: int
    completed: int

    def __init__(self, context: Any, device: Any, dev: Device, name: str) -> None:
        with cl_errors(name):
            self.queue = cl.CommandQueue(
                context, device, properties=cl.command_queue_properties.PROFILING_ENABLE
            )
        self.context = context
        self._device = dev
        self.name = name
        _OPEN.add(self)
        self._lock = threading.Lock()
        #: The submitter waits on this for work; the completer for enqueued positions.
        self._work_cv = threading.Condition(self._lock)
        self._enqueued_cv = threading.Condition(self._lock)
        #: Blocking waiters wait on this for completed positions.
        self._done_cv = threading.Condition(self._lock)
        #: Positions handed out / enqueued by the submitter (or failed) / completed.
        self.submitted = 0
        self._enqueued = 0
        self.completed = 0
        self._todo: deque[_Work] = deque()
        #: seq -> the event of its command (None: no command), from enqueue to completion
        self._events: dict[int, Any] = {}
        #: seq -> what its command uses, kept alive until it has completed
        self._keep: dict[int, tuple[Any, ...]] = {}
        #: seq -> called with the event by the completer once the position has completed
        self._hooks: dict[int, Callable[[Any], None]] = {}
        #: seq -> the positions of other streams it waited for (until it has completed)
        self._deps: dict[int, Sequence[tuple[CLStream, int]]] = {}
        #: (seq, user event): set complete by the completer when position seq completes
        self._gates: list[tuple[int, Any]] = []
        #: Async waiters, soonest first (called by the completer, or by close)
        self._waiters = Waiters(self._lock)
        #: (seq, check) of commands that can fail on the device (an index out of range), and of
        #: commands that failed to enqueue (a :class:`_Failure`): once position seq has
        #: completed, check() returns the error to raise, or None.
        self.checks: list[tuple[int, Callable[[], BaseException | None]]] = []
        #: Every thread started (joined by close); the running submitter and completer.
        self._threads: list[threading.Thread] = []
        self._submitter: threading.Thread | None = None
        self._completer: threading.Thread | None = None
        self._closed = False
        self._quiet = False  # errors are dropped (the backend is shutting down)

    @property
    def device(self) -> Device:
        return self._device

    def __repr__(self) -> str:
        return f"<CLStream {self.name}>"

    # -- submission -------------------------------------------------------------------------------
    def submit(
        self,
        fn: Enqueue,
        keepalive: Iterable[Any] = (),
        deps: Sequence[tuple[CLStream, int]] = (),
        hook: Callable[[Any], None] | None = None,
    ) -> int:
        """Queue ``fn(queue, wait_for) -> event`` as the stream's next position; returns it.

        ``deps`` are positions of other streams the command must run after (their events come
        in ``wait_for``). ``fn`` and ``keepalive`` stay referenced until the position has
        completed. ``hook(event)`` runs on the completer thread once it has. Never makes an
        OpenCL call on the calling thread.
        """
        with self._lock:
            if self._closed:
                raise StaleHandleError(
                    f"{self!r}: the stream was closed (its backend was shut down)"
                )
            seq = self.submitted + 1
            self.submitted = seq
            self._keep[seq] = (fn, *keepalive)
            own = [d for d in deps if d[0] is not self] if deps else ()
            self._todo.append(_Work(seq, fn, own, hook))
            if self._submitter is None:
                self._submitter = self._spawn_locked(self._submit_loop, "submit")
            if self._completer is None:
                self._completer = self._spawn_locked(self._complete_loop, "complete")
            self._work_cv.notify()
            return seq

    def record(self, event: Any, keepalive: Iterable[Any] = ()) -> int:
        """Record ``event``, a command already enqueued on :attr:`queue` by the caller, as the
        stream's next position (for a stream with nothing queued, such as a new one: commands
        still waiting for the submitter would run after it). Prefer :meth:`submit`."""
        return self.submit(lambda queue, wait_for: event, keepalive)

    def _spawn_locked(self, target: Callable[[], None], role: str) -> threading.Thread:
        thread = threading.Thread(
            target=target, name=f"accelkit-opencl-{role}:{self.name}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()
        return thread

    def _submit_loop(self) -> None:
        queue = self.queue
        since_flush = 0
        while True:
            with self._lock:
                while not self._todo and not self._closed:
                    if not self._work_cv.wait(_IDLE_EXIT) and not self._todo:
                        break  # idle: the next submission starts another thread
                if not self._todo:
                    self._submitter = None
                    return
                work = self._todo.popleft()
                more = bool(self._todo)
            seq = work.seq
            event: Any = None
            error: AccelError | None = None
            try:
                wait_for = None
                if work.deps:
                    wait_for = [
                        e for s, q in work.deps if (e := s._event_once_enqueued(q)) is not None
                    ]
                event = work.fn(queue, wait_for or None)
                since_flush += 1
                if not more or since_flush >= _FLUSH_EVERY:
                    since_flush = 0
                    queue.flush()  # a command the queue holds back would not start
            except BaseException as exc:  # reported at the next await that covers seq
                error = as_accel_error(exc, self.name)
                event = self._marker_after_failure(queue)
            with self._lock:
                self._events[seq] = event
                if work.hook is not None:
                    self._hooks[seq] = work.hook
                if work.deps:
                    self._deps[seq] = work.deps
                if error is not None:
                    self._fail_locked(seq, error)
                self._enqueued = seq
                self._enqueued_cv.notify_all()
            del work, event, error  # the closure lives on in _keep until completion

    @staticmethod
    def _marker_after_failure(queue: Any) -> Any:
        """After a closure failed: a marker, so that what it kept alive is released only after
        any command it did enqueue before failing (None where the queue refuses it too)."""
        try:
            queue.flush()
            return cl.enqueue_marker(queue)
        except Exception:  # a broken queue: the failure is reported anyway
            return None

    def _fail_locked(self, seq: int, error: BaseException) -> None:
        if not self._quiet:
            self.checks.append((seq, _Failure(error)))

    def _event_once_enqueued(self, seq: int) -> Any | None:
        """The event of position ``seq`` once the submitter has enqueued it; None if it has
        completed already or has no command. Blocks (on another stream's submitter thread)."""
        with self._lock:
            while self._enqueued < seq and not (self._closed and not self._threads_alive()):
                self._enqueued_cv.wait(1.0)
            if seq <= self.completed:
                return None
            return self._events.get(seq)

    def _threads_alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _complete_loop(self) -> None:
        timed_out = False
        while True:
            with self._lock:
                while self._enqueued <= self.completed:
                    idle = self.submitted <= self.completed
                    if idle and (self._closed or timed_out):
                        self._completer = None  # the next submission starts another thread
                        return
                    timed_out = not self._enqueued_cv.wait(_IDLE_EXIT)
                timed_out = False
                seq = self.completed + 1
                event = self._events.get(seq)
                hook = self._hooks.pop(seq, None)
                deps = self._deps.pop(seq, ())
            status = int(_COMPLETE)
            if event is not None:
                with contextlib.suppress(cl.Error):  # a failed command: its status says so
                    event.wait()
                try:
                    status = _status(event)
                except cl.Error:
                    status = -1
            # What this position waited for has completed on the device; its streams say so
            # before this one does (a moment later at most), so that completion reads the same
            # from every stream.
            for other, q in deps:
                other.reach_blocking(q)
            if hook is not None:
                with contextlib.suppress(Exception):  # a hook only records (profiling times)
                    hook(event)
            with self._lock:
                keep = self._keep.pop(seq, ())
            del keep  # before anyone hears of the completion: the pool may reuse these buffers
            with self._lock:
                self._events.pop(seq, None)
                if status < 0:
                    self._fail_locked(
                        seq, DeviceError(f"OpenCL reported error {status} for work on {self.name}")
                    )
                self.completed = seq
                self.prune_checks_locked(seq)
                self._done_cv.notify_all()
                ready = self._waiters.due(seq)
                gates = self._ready_gates_locked(seq) if self._gates else []
            del event, hook, deps
            _open(gates)
            for callback in ready:
                callback()

    def _ready_gates_locked(self, seq: int) -> list[Any]:
        ready = [gate for s, gate in self._gates if s <= seq]
        if ready:
            self._gates = [(s, gate) for s, gate in self._gates if s > seq]
        return ready

    # -- positions and their events ---------------------------------------------------------------
    def position(self, seq: int | None = None) -> Position:
        """Position ``seq`` (the last one submitted by default) as an event-like object."""
        return Position(self, self.submitted if seq is None else seq)

    def event_for(self, seq: int) -> Any | None:
        """An OpenCL event that completes with position ``seq``, or None once it has completed
        (or if it has no command), for code that enqueues on :attr:`queue` itself (submissions
        give :meth:`submit` positions instead). Never waits: the command's event if the
        submitter has enqueued it, else a user event that the completer sets when the position
        completes."""
        return self._event_or_gate(seq, last=False)

    def last_event(self) -> Any | None:
        """An event for the last pending position (see :meth:`event_for`); None when the stream
        is idle."""
        return self._event_or_gate(self.submitted, last=True)

    def _event_or_gate(self, seq: int, last: bool) -> Any | None:
        with self._lock:
            if seq <= self.completed:
                return None
            if self._enqueued >= seq:
                if not last:
                    return self._events.get(seq)
                # The latest command at or before seq: the queue is in order.
                for s in reversed(self._events):
                    event = self._events[s]
                    if s <= seq and event is not None:
                        return event
                return None
            with cl_errors(self.name):
                gate = cl.UserEvent(self.context)
            self._gates.append((seq, gate))
            return gate

    # -- Stream interface -------------------------------------------------------------------------
    def record_event(self) -> CLEvent:
        event = CLEvent(self, 0)

        def marker(queue: Any, wait_for: list[Any] | None) -> Any:
            m = cl.enqueue_marker(queue)
            event._cl_event = m
            return m

        event.seq = self.submit(marker, hook=event._completed)
        return event

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, CLEvent):
            raise InvalidArgumentError(
                f"wait_event takes an event of an OpenCL stream; got {type(event).__name__}"
            )
        if event.stream.context != self.context:
            raise InvalidArgumentError("wait_event: the event belongs to another OpenCL context")
        if self._closed:  # as a submission, even where there is nothing to wait for
            raise StaleHandleError(f"{self!r}: the stream was closed (its backend was shut down)")
        if event.stream is self or event.query():
            return
        self.wait_positions([(event.stream, event.seq)], (event,))

    def wait_positions(
        self, positions: Sequence[tuple[CLStream, int]], keepalive: Iterable[Any] = ()
    ) -> None:
        """Make work submitted to this stream from now on wait for positions of other streams
        (a barrier with a wait list, enqueued by the submitter). No OpenCL call here."""
        deps = [(s, q) for s, q in positions if s is not self and q > s.completed]
        if deps:
            self.submit(_barrier, keepalive, deps)

    # -- waiting ----------------------------------------------------------------------------------
    # Completed positions release what they kept alive as they complete (on the completer
    # thread): ``prune`` has nothing to do (PositionStream's default). ``wait_for``, ``query``,
    # ``synchronize`` and ``synchronize_blocking`` are PositionStream's, over ``add_waiter``,
    # ``wait_for_blocking`` and DeviceErrors' ``raise_errors``.
    def add_waiter(self, seq: int, callback: Callable[[], None]) -> Callable[[], None] | None:
        return self._waiters.add(seq, callback, self._completed_count)

    def _completed_count(self) -> int:
        return self.completed

    async def reach(self, seq: int) -> None:
        """Wait, without any OpenCL call on the loop's thread, until position ``seq`` has
        completed; raises nothing (the errors stay for the awaits that cover them)."""
        if self.completed < seq:
            await wait_for_callback(lambda cb: self.add_waiter(seq, cb))

    def reach_blocking(self, seq: int) -> None:
        with self._lock:
            while self.completed < seq:
                self._done_cv.wait()

    def raise_failure(self, seq: int) -> None:
        """Raise (once) the error of position ``seq``'s own command, if it failed; the errors of
        other positions stay for the awaits that cover them."""
        with self._lock:
            for i, (s, check) in enumerate(self.checks):
                if s == seq and isinstance(check, _Failure) and check.error is not None:
                    error = check.error
                    del self.checks[i]
                    break
            else:
                return
        try:
            raise error
        finally:
            del error

    def wait_for_blocking(self, seq: int) -> None:
        self.reach_blocking(seq)
        self.raise_errors(seq)

    def discard_errors(self) -> None:
        """Forget unreported errors, and drop those of work still queued (at shutdown)."""
        with self._lock:
            self.checks = []
            self._quiet = True

    def close(self) -> None:
        """Let the queued work finish, stop the stream's threads, and release what it kept."""
        _OPEN.discard(self)
        with self._lock:
            self._closed = True
            self._work_cv.notify_all()
            self._enqueued_cv.notify_all()
            threads = list(self._threads)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(_JOIN_TIMEOUT)
        try:
            self.queue.finish()
        except cl.Error as exc:  # a broken device: closing still releases everything
            _log.warning("accelkit-opencl: %s: finishing the queue failed: %s", self.name, exc)
        with self._lock:
            # (The checks stay: an await woken by the last work may not have taken its own.)
            self._todo.clear()
            self._events.clear()
            self._hooks.clear()
            self._deps.clear()
            keep = list(self._keep.values())
            self._keep.clear()
            self._enqueued = self.completed = self.submitted
            self._done_cv.notify_all()
            ready = self._waiters.due(self.submitted)
            gates = [gate for _, gate in self._gates]
            self._gates = []
            self._threads = [t for t in self._threads if t.is_alive()]
        del keep
        _open(gates)
        for callback in ready:
            callback()


def _barrier(queue: Any, wait_for: list[Any] | None) -> Any:
    # Later commands of this (in-order) queue start after the events of wait_for.
    return cl.enqueue_barrier(queue, wait_for=wait_for) if wait_for else None


def _open(gates: list[Any]) -> None:
    for gate in gates:
        with contextlib.suppress(cl.Error):
            gate.set_status(_COMPLETE)


async def wait_cl_event(event: Any, queue: Any, what: str = "a command") -> None:
    """Wait for an OpenCL event (one the caller enqueued itself) on a worker thread: no OpenCL
    call on the loop's thread. Streams' positions are awaited with :meth:`CLStream.wait_for`."""
    await anyio.to_thread.run_sync(
        wait_cl_event_blocking, event, queue, what, abandon_on_cancel=True
    )


def wait_cl_event_blocking(event: Any, queue: Any, what: str = "a command") -> None:
    queue.flush()
    with contextlib.suppress(cl.Error):
        event.wait()
    status = _status(event)
    if status < 0:
        raise DeviceError(f"OpenCL reported error {status} for {what}")


class CLEvent(PositionEvent[CLStream]):
    """A marker at a position of a :class:`CLStream` (from :meth:`CLStream.record_event`)."""

    def __init__(self, stream: CLStream, seq: int) -> None:
        super().__init__(stream, seq)
        self._cl_event: Any = None
        self._end_ns: int | None = None

    @property
    def cl_event(self) -> Any:
        """The marker's OpenCL event (before the submitter has enqueued it, an event that
        completes with it: see :meth:`CLStream.event_for`)."""
        if self._cl_event is None:
            return self._stream.event_for(self.seq)
        return self._cl_event

    def _completed(self, event: Any) -> None:
        # On the completer thread: the profiling time is read now, never on the loop's thread.
        if event is not None:
            self._end_ns = int(event.profile.end)

    def _reach_blocking(self) -> None:
        self._stream.reach_blocking(self.seq)

    def elapsed_ms(self, end: CLEvent) -> float:
        """Milliseconds between this event and ``end`` (the queues profile their commands).

        Blocks until both have completed."""
        self._reach_blocking()
        end._reach_blocking()
        if self._end_ns is None or end._end_ns is None:
            raise DeviceError("elapsed_ms: the OpenCL driver gave no profiling time for an event")
        return float(end._end_ns - self._end_ns) / 1e6

    def __repr__(self) -> str:
        return f"<CLEvent on {self._stream.name} {'done' if self.query() else 'pending'}>"
