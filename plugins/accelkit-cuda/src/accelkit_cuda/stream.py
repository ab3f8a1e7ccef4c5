"""Streams and events on CUDA streams (through CuPy), with every CUDA call off the event loop.

A :class:`CUDAStream` wraps one non-blocking ``cupy.cuda.Stream``. Every submission is one
position (``seq``) on it; a tensor records the stream and position of its last writer.

**Submitting** (:meth:`CUDAStream.submit`) costs the caller no CUDA call: it takes the next
position and queues its work (a ``functools.partial`` of :func:`_work`) for the device's
submission thread (:mod:`accelkit_cuda.submission`), which launches it on the stream (after the
writers on other streams it depends on), then records a blocking-sync event after it. Work that
raises (a CUDA error, CuPy out of memory, a cuBLAS error) does not stop the thread: its error, as
an accelkit error, is raised by the next await that covers its position (as on the CPU backend,
:class:`~accelkit._core.device_errors.DeviceErrors`); a sticky one also poisons the backend.

**Completion** is followed by the stream's completer thread, which waits for those events in
order (``cudaEventSynchronize`` on a blocking-sync event: the thread sleeps; each one, or the
newest pending one, :data:`COMPLETER`), drops what each
position kept alive, and wakes waiters (a completed event goes back to a small pool of the
stream and is recorded again for a later position, so a warm stream makes no new CUDA event per
position: counted over the stand-in; its speed is unverified on a GPU): an ``await`` registers a callback that the completer
calls, which wakes the loop through its thread-safe entry point
(:func:`~accelkit.sdk.wait_for_callback`). Waiting is pure Python on the loop's thread; blocking
waits (``synchronize_blocking``, ``numpy()``) wait on a condition.

**Inline launches** (:data:`INLINE`, off by default): work its submitter marks as a plain
launch (a loaded kernel on pointers, a cuBLAS/cuBLASLt call with a plan made before, a CUDA
graph launched before: nothing that compiles, allocates, frees, copies from the host or
synchronizes) is launched on the caller's thread when the submission thread waits with nothing
queued (:meth:`SubmissionThread.enter`), instead of queued for it: no hand-over, no second
thread's Python under the interpreter lock, and the device starts at once. Such positions share
end events as a chain does (:data:`COVER_MAX`); the end of the last ones is recorded when
someone waits for them (:meth:`CUDAStream.add_waiter`, ``wait_for_blocking``, ``query``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import cupy

from accelkit.device import Device
from accelkit.errors import (
    AccelError,
    ContextPoisonedError,
    DeviceError,
    InvalidArgumentError,
    OutOfMemoryError,
    StaleHandleError,
)
from accelkit.sdk import DeviceErrors, Event, PositionStream, Waiters
from accelkit_cuda.errors import translate
from accelkit_cuda.submission import Bell, SubmissionThread
from accelkit_cuda.switches import env_switch

_log = logging.getLogger("accelkit.cuda")

__all__ = [
    "CUDA_ERRORS", "CUDAEvent", "CUDAStream", "Position", "as_accel_error", "block_failure",
    "reported_failure",
]  # fmt: skip

#: What CuPy raises for a failed CUDA call: runtime API errors, and driver API errors (kernel
#: launches and module loads go through the driver). Both carry the CUDA error code.
CUDA_ERRORS = (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)

#: How many completed end-of-position events a stream keeps for reuse (more are dropped).
_SPARE_EVENTS = 64
#: How long a stream's close waits for the submission thread to reach it (seconds): as long
#: as the thread's own close waits to join it.
_CLOSE_TIMEOUT = 60.0

#: How a stream's completer thread waits: ``"each"`` position's event in turn (a wake-up, a
#: round of callbacks and a GIL acquisition per position), or the ``"newest"`` pending
#: position's (one wake-up for a chain of positions; an awaited early position is then seen
#: done when the newest position queued at that moment is). ``ACCELKIT_CUDA_COMPLETER`` sets it
#: at import; ``benchmarks/bench_cuda.py`` runs the transformer block under both (interleaved),
#: to decide the default on a GPU (unmeasured when written).
COMPLETER = (
    "newest" if os.environ.get("ACCELKIT_CUDA_COMPLETER", "").strip() == "newest" else "each"
)


def _spin_us() -> float:
    """``ACCELKIT_CUDA_SPIN_US`` in microseconds, 0 to 1000000; anything else is warned about
    (by name) and read as 0, as an unknown ``ACCELKIT_CUDA_COMPLETER`` is read as the default:
    a typo must not keep the plugin from loading."""
    raw = os.environ.get("ACCELKIT_CUDA_SPIN_US", "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1e6:  # (NaN included)
        _log.warning(
            "ACCELKIT_CUDA_SPIN_US=%r: expected 0 to 1000000 microseconds; the completer will"
            " not poll", raw,
        )  # fmt: skip
        return 0.0
    return value


#: How long, in microseconds, a stream's completer polls an end event (``cudaEventQuery``, the
#: interpreter lock given up between polls) before it sleeps on it (``cudaEventSynchronize``
#: on a blocking-sync event), and only while someone awaits that position (or an earlier one)
#: or blocks on the stream, and the submission thread has nothing more queued (its Python would
#: share the GIL with the polls): a sleeping thread is woken by the driver some tens of
#: microseconds after the GPU finished, which an await of a short op pays in full (PyTorch's
#: ``synchronize`` spins for the whole wait). 0: no polling. ``ACCELKIT_CUDA_SPIN_US`` sets it
#: at import; ``benchmarks/bench_cuda.py`` times an add's round trip and the transformer block
#: under both, interleaved (unmeasured when written).
SPIN_US = _spin_us()


def _inline() -> bool:
    """``ACCELKIT_CUDA_INLINE`` as a flag (1/true/yes/on); anything else but 0/false/no/off is
    warned about and read as off."""
    return env_switch("ACCELKIT_CUDA_INLINE", "inline launches stay off")


#: Whether a plain launch is made on the caller's thread while the submission thread is idle
#: (see the module docstring; ``submit(..., inline=True)`` marks such work). Off by default
#: until a GPU run says it pays: ``ACCELKIT_CUDA_INLINE=1`` sets it at import, and it is read at
#: each submission (``benchmarks/bench_cuda.py`` and ``bench_host.py`` flip it to compare).
INLINE = _inline()

#: Positions in flight (submitted, not yet seen complete) above which a launch is queued even
#: where it could be made inline: a driver whose launch queue is full (about a thousand pending
#: launches) blocks the launching thread, which must not be the event loop's. A position may
#: be several launches (a GEMM and its bias, a graph); the count of completed positions lags
#: the device (the completer marks them), so the estimate errs on the side of queueing.
INLINE_DEPTH = 128


def _poll(event: Any, seconds: float) -> bool:
    """Poll ``event`` until it is done (True) or ``seconds`` passed (False): the completer,
    before it sleeps on it. Between polls the thread yields the interpreter lock and the CPU."""
    clock = time.perf_counter
    deadline = clock() + seconds
    while not event.done:
        if clock() >= deadline:
            return False
        os.sched_yield()
    return True


#: How many positions in a row one end event may mark (see :meth:`CUDAStream._recorded`): what
#: they keep alive waits for it, and so does an await of the first of them.
COVER_MAX = 16


#: The event of a pending position that has none of its own: the next recorded one marks its
#: end (see :meth:`CUDAStream._recorded`).
COVERED: Any = object()

OnError = Callable[[AccelError], AccelError]
#: What other streams a submission waits for: ``(stream, position)`` of each pending writer of
#: its inputs (:func:`accelkit.sdk.other_writers`).
Deps = Sequence[tuple[Any, int]]


def _same(error: AccelError) -> AccelError:
    return error


def as_accel_error(exc: BaseException, what: str, on_error: OnError = _same) -> AccelError:
    """The accelkit error to report for ``exc``, raised by work on the submission thread."""
    if isinstance(exc, AccelError):
        return exc
    if isinstance(exc, CUDA_ERRORS):
        return on_error(translate(exc, what))
    if isinstance(exc, (cupy.cuda.memory.OutOfMemoryError, MemoryError)):
        return OutOfMemoryError(f"{what}: the device is out of memory ({exc})")
    if type(exc).__name__ in ("CUBLASError", "CUSOLVERError", "CURANDError"):
        return DeviceError(f"{what}: {exc}")
    error = DeviceError(f"{what} failed: {exc!r}")
    error.__cause__ = exc
    return error


def _usable() -> None:
    """A stream's ``check_usable`` until its backend sets its own (which raises once poisoned)."""


#: The block whose failed ``cudaMalloc`` an error reports (:func:`block_failure`): every use
#: of such a block (an op, a copy, a read) fails with an error of its own, and the failure is
#: raised once (claimed by :meth:`CUDAStream.claim_error_locked`, the uses it covers dropped by
#: :meth:`CUDAStream.covered_checks_locked`). Weak keys: an entry goes with its error.
_FAILED_BLOCKS: weakref.WeakKeyDictionary[BaseException, Any] = weakref.WeakKeyDictionary()
#: Held to claim a failed block's report (:meth:`CUDAStream.claim_error_locked`): the streams'
#: own locks do not order two streams' awaits.
_REPORT_LOCK = threading.Lock()


def block_failure(error: AccelError, block: Any) -> AccelError:
    """``error`` as the report of a use of ``block``, whose ``cudaMalloc`` failed (submission
    thread): raised once for the block, by the first await that covers a use of it."""
    _FAILED_BLOCKS[error] = block
    return error


def reported_failure(block: Any) -> StaleHandleError:
    """The error of a use of ``block`` after an await raised its failed ``cudaMalloc``: the
    tensor has no memory, and the OutOfMemoryError is not raised a second time."""
    return StaleHandleError(
        f"this work used a tensor whose {block.size}-byte block has no device memory: its"
        " cudaMalloc found the device full, and an earlier await raised that OutOfMemoryError;"
        " a tensor whose allocation failed cannot be used (make it again)"
    )


class _Failure:
    """The check of a position whose work failed: returns its error until it is raised. A use
    of a block whose ``cudaMalloc`` failed returns :func:`reported_failure` instead once an
    await has raised that failure (from another position)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self) -> BaseException | None:
        error = self.error
        block = _FAILED_BLOCKS.get(error) if _FAILED_BLOCKS else None
        if block is not None and block.reported:
            self.error = error = reported_failure(block)
        return error


class Position:
    """A position of a stream as a device event would be asked about it: ``done`` answers from
    the stream's counters, without a CUDA call (deferred frees poll these)."""

    __slots__ = ("seq", "stream")

    def __init__(self, stream: CUDAStream, seq: int) -> None:
        self.stream = stream
        self.seq = seq

    @property
    def done(self) -> bool:
        return self.stream._completed_upto >= self.seq


def _work(
    stream: CUDAStream, seq: int, deps: tuple[CUDAStream, ...], fn: Callable[[], object],
    keepalive: object, what: str, inline: bool = False,
) -> None:  # fmt: skip
    """On the submission thread (or ``inline``, a caller holding its turn): position ``seq``'s
    work (:meth:`CUDAStream.submit`), launched on ``stream`` after the other streams ``deps``;
    its error is kept for the await that covers the position, and its end marked for the
    completer either way."""
    result: object = None
    interrupt: BaseException | None = None
    try:
        if stream._abandoned:
            return
        stream.check_usable()  # poisoned since it was queued: no CUDA call
        with stream.cp:
            for s in deps:
                stream.cp.wait_event(_event(s.cp))
            result = fn()
    except BaseException as exc:
        stream._fail(seq, as_accel_error(exc, what, stream.on_error))
        if inline and not isinstance(exc, Exception):  # the caller's interrupt: its own
            interrupt = exc
    stream._recorded(seq, (keepalive, result), inline)
    if interrupt is not None:
        raise interrupt


def _flush_covered(stream: CUDAStream) -> None:
    """On the submission thread: mark the end of ``stream``'s covered positions, if any."""
    if stream._inline_covered and stream._covered:
        stream._end_covered()


class CUDAStream(DeviceErrors, PositionStream):
    """One CUDA stream fed by the device's submission thread (see the module docstring).

    A :class:`~accelkit.sdk.PositionStream` whose errors are :class:`~accelkit.sdk.DeviceErrors`
    checks (DeviceErrors comes first: its ``raise_errors``/``discard_errors`` are the ones)."""

    #: The last position handed out (a plain attribute, counted under ``_lock``).
    submitted: int

    def __init__(
        self,
        dev: Device,
        name: str,
        thread: SubmissionThread,
        on_error: OnError = _same,
        after: Sequence[CUDAStream] = (),
    ) -> None:
        #: The ``cupy.cuda.Stream``: made on the submission thread (first in its queue).
        self.cp: Any = None
        self.thread = thread
        self.on_error = on_error
        #: Raises ContextPoisonedError once the backend is poisoned (set by the backend): public
        #: methods call it first, so a poisoned backend refuses before anything is queued.
        self.check_usable: Callable[[], None] = _usable
        self._device = dev
        self.name = name
        self._lock = threading.Lock()
        self._done_cv = threading.Condition(self._lock)
        # The completer waits for positions on a bell (rung in C calls, only when it waits),
        # and blocking waiters are counted (under ``_lock``), so that each position's end
        # notifies only when someone waits: ``Condition.notify`` is Python code (the owner
        # check, a deque of the waiters) run per position on the submission and completer
        # threads, which share the interpreter lock with the caller.
        self._work_bell = Bell()
        self._blocked = 0
        self.submitted = 0
        self._completed_upto = 0
        self.checks: list[tuple[int, Callable[[], BaseException | None]]] = []
        #: Keep tensors referenced until their work completes (set once there are two streams).
        self.track = False
        #: (seq, event, objects kept alive until it completes), for the completer.
        self._pending: deque[tuple[int, Any, object]] = deque()
        #: (seq, keepalive) of positions whose end the next event recorded will mark (the
        #: submission thread's alone; see :meth:`_recorded`).
        self._covered: list[tuple[int, object]] = []
        self._waiters = Waiters(self._lock)
        self._completer: threading.Thread | None = None
        self._closed = False
        self._abandoned = False
        #: Set once :meth:`close` or :meth:`abandon` began: a submission is refused from then on
        #: (it could not be waited for: the completer ends).
        self._ended = False
        #: ``completed`` when the stream was abandoned: the work of later positions was dropped.
        self._abandoned_after = 0
        #: Blocking-sync events the completer has seen complete, re-recorded for later positions
        #: (a CUDA event may be recorded again once its last record is done) instead of a new
        #: ``cupy.cuda.Event`` per position. Appended by the completer, popped by the submission
        #: thread (list append/pop are atomic).
        self._spare_events: list[Any] = []
        #: Counters the step timeline reads (``accelkit_cuda.timeline``): events made and
        #: recorded for positions (submission thread), and the completer's rounds (each takes
        #: one or more completed positions off the queue).
        self.events_created = 0
        self.events_recorded = 0
        self.completer_rounds = 0
        #: Rounds whose end event the completer saw done by polling (:data:`SPIN_US`).
        self.polled_done = 0
        #: Positions launched on their caller's thread (:data:`INLINE`).
        self.inline_launches = 0
        #: Whether :attr:`_covered` holds a position launched inline (which only a wait, a
        #: later event or a quiet stream's poll marks: :meth:`_flush`, :meth:`poll_quiet`).
        self._inline_covered = False
        #: ``submitted`` at the last :meth:`poll_quiet`, and when it last queued a flush.
        self._polled_at = -1
        self._flush_queued_at = -1
        others = tuple(after)

        def open_stream() -> None:
            try:
                self.cp = cupy.cuda.Stream(non_blocking=True)
                # Blocks recycled while there was one stream may still be used by queued work:
                # the new stream starts after everything queued so far on the others.
                for s in others:
                    if s.cp is not None:
                        self.cp.wait_event(_event(s.cp))
            except BaseException as exc:  # a sticky error poisons the backend (on_error)
                self._fail(1, as_accel_error(exc, f"creating {name}", self.on_error))

        thread.submit(open_stream)

    @property
    def device(self) -> Device:
        return self._device

    def __repr__(self) -> str:
        return f"<CUDAStream {self.name}>"

    # -- submission -------------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[], object],
        keepalive: object = (),
        after: Deps = (),
        what: str = "a kernel",
        inline: bool | Callable[[], bool] = False,
    ) -> int:
        """Queue ``fn`` (which launches on :attr:`cp`) for the submission thread; returns its
        position at once. ``after``: the ``(stream, position)`` of pending writers on other
        streams; the work waits (on the device) for everything queued on those streams when it
        is launched. ``fn``'s result and ``keepalive`` stay referenced until the work is done.
        ``inline``: ``fn`` is a plain launch (see the module docstring), which with
        :data:`INLINE` is made here where the submission thread is idle; a function says
        whether it is, asked in the thread's turn (what it reads, the thread may change)."""
        self.check_usable()
        if inline and INLINE and not after:
            seq = self._submit_inline(fn, keepalive, what, inline)
            if seq:
                return seq
        deps: tuple[CUDAStream, ...] = ()
        if after:  # each stream once
            deps = tuple({id(s): s for s, _ in after}.values())
        # A partial, not a closure: two objects the garbage collector tracks (the partial and
        # its arguments) where a closure over six variables made eight (a function, a cell a
        # variable and their tuple), each alive, and so counted and traversed by collections,
        # for as long as the work is queued (``test_gc_tracked_objects_per_queued_op``). The
        # position is taken and queued in one hold of the lock: positions of a stream are
        # queued in order even from several threads, and an inline launch that finds work
        # queued since its turn began queues instead (:meth:`_submit_inline`).
        with self._lock:
            if self._ended:
                raise self._ended_error(what)
            self.submitted += 1
            seq = self.submitted
            self.thread.submit(partial(_work, self, seq, deps, fn, keepalive, what), self)
        return seq

    def _ended_error(self, what: str) -> StaleHandleError:
        return StaleHandleError(
            f"{what} on {self.name}: the stream was closed (its backend was shut down, or is"
            " shutting down)"
        )

    def _submit_inline(
        self, fn: Callable[[], object], keepalive: object, what: str,
        plain: bool | Callable[[], bool],
    ) -> int:  # fmt: skip
        """Launch ``fn`` here, in the submission thread's turn, and return its position; 0
        (nothing done) where the thread is busy or has work queued, the calling thread has
        another device's context current, or :data:`INLINE_DEPTH` positions are in flight."""
        if self.submitted - self._completed_upto >= INLINE_DEPTH:
            return 0
        thread = self.thread
        queued = thread.enter()
        if queued is None:
            return 0
        try:
            if callable(plain) and not plain():
                return 0
            with self._lock:
                if thread.queued != queued or self._ended:  # queued work first; refusals too
                    return 0
                self.submitted += 1
                seq = self.submitted
            self.inline_launches += 1
            _work(self, seq, (), fn, keepalive, what, True)
            # Someone who waits for this position may have checked for covered positions
            # before it was covered (a blocking wait on another thread while the launch let
            # the interpreter lock go): a waiter registers before it checks, so one of the two
            # sees the other.
            if self._inline_covered and (
                self._blocked or ((first := self._waiters.first()) is not None and first <= seq)
            ):
                self._end_covered()
        finally:
            thread.leave()
        return seq

    def _fail(self, seq: int, error: AccelError) -> None:
        error.__traceback__ = None
        with self._lock:
            self.checks.append((seq, _Failure(error)))

    def _recorded(self, seq: int, keep: object, inline: bool = False) -> None:
        """In the submission thread's turn: mark the end of position ``seq`` for the completer.

        Where the thread's next closure is this stream's work too (a chain of ops submitted
        faster than they launch), or the position was launched inline (its caller's next op
        may well be too), no event is recorded now: the position waits in :attr:`_covered` and
        the next event recorded marks its end as well (the stream runs in order), at most
        :data:`COVER_MAX` positions to an event. A chain of N ops then costs one
        ``cudaEventRecord`` and one completer round, not N of each (each a release of the
        interpreter lock on the submission thread and a wake-up of the completer, which the
        submission and loop threads then wait for). Covered inline positions are marked when
        someone waits for them (:meth:`_flush`) or by the next event recorded."""
        covered = self._covered
        if inline:  # (before the append: a flag left set costs one needless flush at most)
            self._inline_covered = True
        covered.append((seq, keep))
        if (
            len(covered) <= COVER_MAX
            and (inline or self.thread.follows(self))
            and not self._abandoned
            and self._usable()
        ):
            return
        self._end_covered()

    def _end_covered(self) -> None:
        """In the submission thread's turn: record one event at the end of the stream, which
        marks the end of every covered position, and hand them to the completer."""
        covered = self._covered
        if not covered:  # (closed or abandoned meanwhile: nothing is left to mark)
            self._inline_covered = False
            return
        event: Any = None
        if not self._abandoned and self._usable():
            try:
                event = self._end_event()
            except BaseException as exc:  # told to the first position it would have marked
                self._fail(
                    covered[0][0], as_accel_error(exc, f"work on {self.name}", self.on_error)
                )
        with self._lock:
            seq, keep = covered.pop()
            if covered:
                self._pending.extend([(s, COVERED, k) for s, k in covered])
                covered.clear()
            self._pending.append((seq, event, keep))
            self._inline_covered = False  # (once they are the completer's)
            del keep
            if self._completer is None:
                self._completer = threading.Thread(
                    target=self._complete, name=f"accelkit-cuda-done-{self.name}", daemon=True
                )
                self._completer.start()
            else:
                self._work_bell.ring()

    def _flush(self, queue: bool = True) -> None:
        """Mark the end of the positions launched inline that no event marks yet (none: a
        queued chain's end is the thread's to mark): here, in the submission thread's turn
        where it is free, else (``queue``) by a closure queued for it."""
        if not self._inline_covered or self._abandoned:
            return
        thread = self.thread
        if thread.enter() is not None:
            try:
                if self._covered:
                    self._end_covered()
            finally:
                thread.leave()
        elif queue:
            thread.submit(partial(_flush_covered, self))

    def poll_quiet(self) -> None:
        """Before an allocation while frees wait for the streams to pass their points (the
        backend's ``prune_streams``): mark the end of positions launched inline on a stream
        that has had no submission since the last such poll. Nobody may ever wait for them,
        and a free waits for them; a busy stream's chain gets its event within
        :data:`COVER_MAX` positions. Marked in the submission thread's turn where it is free,
        else by one closure queued for it a quiet spell (the thread may stay busy)."""
        submitted = self.submitted
        if self._inline_covered and submitted == self._polled_at:
            # In the turn where the thread is free, else by one closure a quiet spell
            self._flush(queue=self._flush_queued_at != submitted)
            self._flush_queued_at = submitted
        self._polled_at = submitted

    def _end_event(self) -> Any:
        """A blocking-sync event recorded now at the end of the stream (submission thread): a
        spare one when the completer has handed one back, else a new one."""
        try:
            event = self._spare_events.pop()
        except IndexError:
            event = cupy.cuda.Event(block=True, disable_timing=True)
            self.events_created += 1
        event.record(self.cp)
        self.events_recorded += 1
        return event

    def _usable(self) -> bool:
        try:
            self.check_usable()
        except AccelError:
            return False
        return True

    def _complete(self) -> None:
        """The completer thread: waits for the positions' events in order, one position a round
        (``COMPLETER == "each"``) or, with ``"newest"``, the newest pending position that has an
        event: the stream runs in order, so every position before it is done when it is, and
        a chain of N positions costs one wake-up, not N (see :data:`COMPLETER`)."""
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._work_bell.wait(self._lock)
                if not self._pending:
                    return
                pending = self._pending
                # The first position that has an event of its own (or none: its end was not
                # recorded) ends the round; positions covered by its event go with it.
                last = 0
                while pending[last][1] is COVERED:
                    last += 1
                if COMPLETER == "newest":
                    for i in range(len(pending) - 1, last, -1):
                        if pending[i][1] is not None and pending[i][1] is not COVERED:
                            last = i
                            break
                first = pending[0][0]
                seq, event = pending[last][:2]  # (not its keepalive: see below)
            ok = False
            if event is not None and not self._abandoned and self._usable():
                try:
                    if (
                        SPIN_US
                        and (self._blocked or self._awaited(seq))
                        and not self.thread.has_queued()
                    ):
                        self.polled_done += _poll(event, SPIN_US * 1e-6)
                    event.synchronize()
                except BaseException as exc:
                    # Which of the round's positions faulted, CUDA does not say: the error is
                    # raised by an await of any of them (checks report at their position and
                    # to every later one), not only of the one whose event told it.
                    error = as_accel_error(exc, f"work on {self.name}", self.on_error)
                    self._fail(first, error)
                else:
                    ok = True
            with self._lock:
                done = [self._pending.popleft() for _ in range(last + 1)]
                # Their records are done: the events may be recorded again (a failed wait's
                # are dropped).
                if ok:
                    spare = self._spare_events
                    spare.extend(
                        [p[1] for p in done if p[1] is not None and p[1] is not COVERED][
                            : _SPARE_EVENTS - len(spare)
                        ]
                    )
                # Nothing here may keep a position's keepalive once it is done.
                del done, event
                self._completed_upto = max(self._completed_upto, seq)
                self.completer_rounds += 1
                ready = self._due_locked()
            for cb in ready:
                cb()

    def _awaited(self, seq: int) -> bool:
        """Whether an await waits for position ``seq`` or an earlier one (a hint)."""
        first = self._waiters.first()
        return first is not None and first <= seq

    def _due_locked(self) -> list[Callable[[], None]]:
        if self._blocked:
            self._done_cv.notify_all()
        ready = self._waiters.due(self._completed_upto)
        self.prune_checks_locked(self._completed_upto)
        return ready

    # ``prune`` is PositionStream's (nothing): the completer thread follows completion.

    @property
    def completed(self) -> int:
        return self._completed_upto

    def hold(self, objects: Iterable[Any]) -> int:
        """Keep ``objects`` (a kernel's module, pinned host blocks) alive until the work queued
        so far on this stream has completed; the completer thread drops them then (never the
        loop's thread). Returns the position that marks that point."""
        return self.submit(lambda: None, tuple(objects), what="holding objects")

    def position(self) -> Position:
        """The current end of the stream, as an event-like :class:`Position`."""
        return Position(self, self.submitted)

    # -- waiting ----------------------------------------------------------------------------------
    def claim_error_locked(self, error: BaseException) -> BaseException:
        """DeviceErrors' hook: a block's failed ``cudaMalloc`` is raised by one await of all
        the streams that used it. The first to take it marks the block reported, under a lock
        the streams share; an await of another stream taking it at the same moment (under its
        own lock) raises :func:`reported_failure` instead, for that use alone, as any use
        awaited after the report does (each raises its own)."""
        block = _FAILED_BLOCKS.get(error) if _FAILED_BLOCKS else None
        if block is None:
            return error
        with _REPORT_LOCK:
            if not block.reported:
                block.reported = True
                return error
        return reported_failure(block)

    def covered_checks_locked(
        self, error: BaseException, seq: int, checks: list[tuple[int, Any]]
    ) -> list[tuple[int, Any]]:
        """DeviceErrors' hook: a block's failed ``cudaMalloc`` is raised once. The await that
        raises it covers every use of that block at or before ``seq`` on this stream (their
        checks are dropped: an op that could not run for it wrote nothing, and its outputs'
        contents are unspecified, as after any failed op); a use awaited later, or on another
        stream, raises :func:`reported_failure` (StaleHandleError), not the OutOfMemoryError
        again. The claim (:meth:`claim_error_locked`) and the drop happen in the hold of the
        lock the error was taken under."""
        block = _FAILED_BLOCKS.get(error) if _FAILED_BLOCKS else None
        if block is None:
            return checks
        return [
            (s, c)
            for s, c in checks
            if s > seq or type(c) is not _Failure or _FAILED_BLOCKS.get(c.error) is not block
        ]

    def add_waiter(self, seq: int, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (from any thread) once position ``seq`` has completed."""
        # Registered first, then the check (see _submit_inline: one of the two sees the other)
        remove = self._waiters.add(seq, callback, lambda: self._completed_upto)
        if self._inline_covered:
            self._flush()
        return remove

    async def wait_for(self, seq: int) -> None:
        """Wait, without blocking the loop, until position ``seq`` has completed (a poisoned
        backend refuses first)."""
        self.check_usable()
        await super().wait_for(seq)

    # ``wait_for_quietly`` (shutdown: no error raised, no poison check) is PositionStream's.

    def wait_for_blocking(self, seq: int) -> None:
        self.check_usable()
        with self._lock:
            wait = self._completed_upto < seq
            if wait:  # counted first, then the check for covered positions (_submit_inline)
                self._blocked += 1
        if wait:
            try:
                if self._inline_covered:
                    self._flush()
                with self._lock:
                    while self._completed_upto < seq:
                        self._done_cv.wait()
            finally:
                with self._lock:
                    self._blocked -= 1
        self.raise_errors(seq)

    # -- Stream interface -------------------------------------------------------------------------
    def record_event(self) -> CUDAEvent:
        self.check_usable()
        if self._ended:
            raise self._ended_error("record_event")
        event = CUDAEvent(self, self.submitted)

        def record() -> None:
            try:
                e = cupy.cuda.Event(disable_timing=False)
                e.record(self.cp)
                event.cp_event = e
            except BaseException as exc:
                error = as_accel_error(exc, f"recording an event on {self.name}", self.on_error)
                self._fail(event.seq, error)

        self.thread.submit(record)
        return event

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, CUDAEvent):
            raise InvalidArgumentError(
                f"wait_event takes an event of a CUDA stream; got {type(event).__name__}"
            )
        if event.stream.device != self._device:
            raise InvalidArgumentError("wait_event: the event belongs to another device")
        self.check_usable()
        self.submit(lambda: self.cp.wait_event(event.cp_event), (event,), what="wait_event")

    def query(self) -> bool:
        self.check_usable()
        if self._inline_covered:
            self._flush()
        return self._completed_upto >= self.submitted

    # ``synchronize`` and ``synchronize_blocking`` are PositionStream's (through wait_for and
    # wait_for_blocking, which check usability).

    def abandon(self) -> None:
        """Forget everything queued (the context died): no CUDA call is made for it, and every
        await of a position not yet seen complete returns at once, raising the poisoning (its
        work was dropped); later submissions are refused."""
        self._abandoned = True
        with self._lock:
            self._ended = True
            self._abandoned_after = self._completed_upto
            self.checks = []
            self._covered = []
            self._inline_covered = False
            self._closed = True
            self._work_bell.ring()
            self._completed_upto = max(self._completed_upto, self.submitted)
            ready = self._due_locked()
        for cb in ready:
            cb()

    def raise_errors(self, seq: int) -> None:
        if self._abandoned and seq > self._abandoned_after:
            raise self.on_error(
                ContextPoisonedError(
                    f"the work at position {seq} of {self.name} was dropped: its CUDA context"
                    " is poisoned"
                )
            )
        super().raise_errors(seq)

    def close(self) -> None:
        """End the stream after the work queued so far has run and completed (blocking: call
        it off the loop); a submission is refused from the moment it is called."""
        with self._lock:
            self._ended = True
        # Work queued on the submission thread before now is launched (and its end marked)
        # before the completer is told to end: its positions complete when it does, not before.
        # A thread stuck past the join timeout (a lost device) is not waited for longer.
        if not self._abandoned:
            try:
                self.thread.call_blocking(partial(_flush_covered, self), _CLOSE_TIMEOUT)
            except TimeoutError:
                _log.warning(
                    "%s: the submission thread did not reach the stream's close in %.0f s;"
                    " its queued work is not waited for", self.name, _CLOSE_TIMEOUT,
                )  # fmt: skip
        with self._lock:
            self._closed = True
            self._work_bell.ring()
            thread = self._completer
        if thread is not None:
            thread.join(60.0)
        with self._lock:
            # (The checks stay: an await woken by the last work may not have taken its own.)
            self._pending.clear()
            self._covered = []  # launched inline and never awaited: what they kept goes now
            self._inline_covered = False
            self._completed_upto = self.submitted
            ready = self._due_locked()
        for cb in ready:
            cb()


def _event(stream: Any) -> Any:
    """A blocking-sync event recorded now at the end of ``stream`` (submission thread)."""
    event = cupy.cuda.Event(block=True, disable_timing=True)
    event.record(stream)
    return event


class CUDAEvent(Event):
    """A CUDA event recorded on a :class:`CUDAStream` (timing enabled)."""

    def __init__(self, stream: CUDAStream, seq: int) -> None:
        self._stream = stream
        #: The ``cupy.cuda.Event``, made and recorded on the submission thread.
        self.cp_event: Any = None
        #: The stream position the event marks.
        self.seq = seq

    @property
    def stream(self) -> CUDAStream:
        return self._stream

    def query(self) -> bool:
        stream = self._stream
        stream.check_usable()
        if stream._inline_covered:
            stream._flush()
        return stream._completed_upto >= self.seq

    async def wait(self) -> None:
        await self._stream.wait_for(self.seq)

    def wait_blocking(self) -> None:
        self._stream.wait_for_blocking(self.seq)

    def elapsed_ms(self, end: CUDAEvent) -> float:
        """Milliseconds of device time between this event and ``end``."""
        self.wait_blocking()
        end.wait_blocking()
        thread = self._stream.thread

        def elapsed() -> float:
            end.cp_event.synchronize()
            return float(cupy.cuda.get_elapsed_time(self.cp_event, end.cp_event))

        return thread.call_blocking(elapsed)

    def __repr__(self) -> str:  # (no query: it may mark inline positions' ends)
        state = "done" if self._stream._completed_upto >= self.seq else "pending"
        return f"<CUDAEvent on {self._stream.name} {state}>"
