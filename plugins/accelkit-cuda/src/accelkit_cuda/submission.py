"""The submission thread: where every CuPy, cuBLAS, cuRAND, NVRTC-module and CUDA runtime call of
a device is made.

One thread per device (per initialized backend) runs queued closures in the order they were
submitted. The event loop's thread only validates, allocates pool accounting, builds closures and
queues them (pure Python), so no CUDA call, no kernel compilation at CuPy's first launch and no
large host copy ever stalls the loop. One thread, not one per stream, because CuPy's cuBLAS,
cuRAND and cuSOLVER handles and its current device are per thread: every call sees the same
handles and the right device, and work of all streams is enqueued in one global order, so a
dependency on another stream's position always points to work already enqueued.

A closure must not raise: the stream wraps each one and records its error for the await that
covers its position (:mod:`accelkit_cuda.stream`). :meth:`SubmissionThread.call` runs a function
there and awaits its result without blocking the loop (lifecycle work: opening the context,
loading modules, the frees of a shutdown).

A closure submitted after :meth:`SubmissionThread.close` (a tensor that outlived its backend
giving its block back) runs on a short-lived thread of its own instead.

**The thread's turn.** The thread runs each round of closures holding its *turn* (a lock). A
caller may take the turn itself (:meth:`SubmissionThread.enter`) while the thread waits with
nothing queued and the caller's thread has the device's CUDA context current, and then make
its CUDA calls in place, in the same global order (an inline launch:
:data:`accelkit_cuda.stream.INLINE`); work queued meanwhile waits for :meth:`leave`. The
thread whose turn it is (the submission thread, or the caller between ``enter`` and ``leave``)
is :func:`turn`'s answer: what is kept per submission thread (the cuBLAS handle, its
workspaces and cuBLASLt plans, :mod:`accelkit_cuda.blas`) is kept on that object, not per OS
thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from accelkit.sdk import wait_for_callback

__all__ = ["Bell", "SubmissionThread", "turn"]

T = TypeVar("T")
_log = logging.getLogger("accelkit.cuda")


class _Holder(threading.local):
    thread: SubmissionThread | None = None


#: Per OS thread: the submission thread whose turn it holds (:func:`turn`).
_holder = _Holder()


def turn() -> SubmissionThread | None:
    """The submission thread whose turn this OS thread holds: that thread's own, or a caller's
    between :meth:`SubmissionThread.enter` and :meth:`SubmissionThread.leave`; else None."""
    return _holder.thread


#: How long :meth:`SubmissionThread.close` waits for the queued work (seconds).
_JOIN_TIMEOUT = 60.0


class Bell:
    """What one thread waits on for work, under a lock of its owner's, like a condition with
    one waiter whose notify is two C calls: the waiter, holding the lock, calls :meth:`wait`,
    which sets :attr:`idle`, releases the lock until :meth:`ring`, and takes it again; a
    producer holding the lock calls :meth:`ring`, which wakes it if it is idle (at most once
    per wait) and does nothing otherwise. ``threading.Condition.notify`` is Python code (an
    owner check, a deque of waiters) run per small op where the submission thread keeps up."""

    __slots__ = ("_lock", "idle")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # released by ring: the waiter's acquire returns
        #: Whether the waiter waits (read and written under the owner's lock).
        self.idle = False

    def wait(self, lock: threading.Lock) -> None:
        """With ``lock`` held: release it until :meth:`ring` is called, then take it again."""
        self.idle = True
        lock.release()
        try:
            self._lock.acquire()
        finally:
            lock.acquire()

    def ring(self) -> None:
        """With the owner's lock held: wake the waiter if it waits."""
        if self.idle:
            self.idle = False
            self._lock.release()


class SubmissionThread:
    """One device's submission thread (see the module docstring)."""

    def __init__(self, device_index: int, name: str) -> None:
        self.device_index = device_index
        self.name = name
        self._queue: deque[tuple[Callable[[], None], object]] = deque()
        #: The round being run (on the thread): what :meth:`follows` looks at first.
        self._batch: deque[tuple[Callable[[], None], object]] = deque()
        # A plain lock (entered in C), and a bell the thread waits on when the queue is empty:
        # a submission rings it only then, in C calls (``Condition.notify`` is Python code,
        # run per small op on the caller's thread whenever the thread keeps up).
        self._lock = threading.Lock()
        self._bell = Bell()
        #: Held while closures run (a round on the thread) or while a caller launches in place
        #: (:meth:`enter` to :meth:`leave`): CUDA calls of the device are made one turn at a time.
        #: An RLock for its ``_is_owned`` (an interrupt in :meth:`enter` must not keep it); never
        #: taken twice by one thread (:meth:`enter` refuses a holder).
        self._turn = threading.RLock()
        #: The device's CUDA context (its primary context), read on the thread once it is
        #: current there; 0 until then (:meth:`enter` refuses).
        self.context = 0
        #: CuPy's driver module (set on the thread): ``ctxGetCurrent`` / ``ctxSetCurrent``.
        self._driver: Any = None
        #: Whether the turn's holder had no context current and was lent the device's.
        self._borrowed = False
        #: What the thread keeps for cuBLAS (:mod:`accelkit_cuda.blas`) and cuBLASLt
        #: (:mod:`accelkit_cuda.blaslt`): made on the thread, used by whoever holds the turn.
        self.blas_state: Any = None
        self.lt_plans: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False
        #: The thread's identifier once started (tests compare the threads of calls with it).
        self.ident: int | None = None
        #: How many times the thread took work off its queue (each time it takes all that is
        #: queued); read by the step timeline (``accelkit_cuda.timeline``) and the tests.
        self.rounds = 0
        #: Closures queued so far (counted under the lock: the last one's number) and started
        #: so far (on the thread: the running one's number). A closure numbered above
        #: ``started`` has not run yet (see :meth:`queued_after`).
        self.queued = 0
        self.started = 0

    def on_thread(self) -> bool:
        return threading.get_ident() == self.ident

    def follows(self, owner: object) -> bool:
        """On the thread, from a closure: whether the next closure it will run was submitted
        with ``owner`` (the rest of this round, else the first one queued since; a closure
        queued is always run, :meth:`close` included)."""
        nxt = self._batch or self._queue
        try:
            return nxt[0][1] is owner
        except IndexError:
            return False

    @property
    def idle(self) -> bool:
        """Whether the thread waits with nothing queued (read without the lock: a hint; the
        step timeline waits for it before a step, so that the step's plain launches may be
        made inline, :meth:`enter`)."""
        return self._bell.idle and not self._queue

    def has_queued(self) -> bool:
        """Whether closures wait to run behind the running one (if any); read without the
        lock, so a hint (the completer's polling, :data:`accelkit_cuda.stream.SPIN_US`)."""
        return bool(self._batch or self._queue)

    def queued_after(self, number: int) -> bool:
        """On the thread, from a closure: whether closure ``number`` (a value of
        :attr:`queued` read after it was submitted) is still queued behind the running one."""
        return number > self.started

    def requeue(self, fn: Callable[[], None]) -> None:
        """On the thread, from a closure: queue ``fn`` behind everything queued, even once
        :meth:`close` was called (the thread runs its queue empty before it ends)."""
        with self._lock:
            self._queue.append((fn, None))
            self.queued += 1

    def submit(self, fn: Callable[[], None], owner: object = None) -> None:
        """Queue ``fn`` after everything submitted before it; returns at once. ``owner`` tags
        it for :meth:`follows` (a stream tags its work)."""
        with self._lock:
            if not self._closed:
                self._queue.append((fn, owner))
                self.queued += 1
                if self._bell.idle:
                    self._bell.ring()
                elif self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, name=f"accelkit-cuda-{self.name}", daemon=True
                    )
                    self._thread.start()
                return
        threading.Thread(target=_guarded(fn), name="accelkit-cuda-late", daemon=True).start()

    def enter(self) -> int | None:
        """On a caller's thread: take the thread's turn, to make CUDA calls in place, where the
        thread waits with nothing queued, the caller's thread has the device's context current
        (or none: it is made current, until :meth:`leave` unless the device is cuda:0, whose
        primary context the runtime makes current on a thread anyway), and no turn is held;
        returns :attr:`queued` at that moment (work queued later must run first: compare
        before launching). Work submitted meanwhile runs after :meth:`leave`, in order. None:
        nothing taken; queue the work."""
        context = self.context
        turn = self._turn
        if not context or turn._is_owned():  # type: ignore[attr-defined]  # (no re-entry)
            return None
        try:
            with self._lock:
                if not self._bell.idle or self._closed or not turn.acquire(False):
                    return None
                queued = self.queued
            driver = self._driver
            current = driver.ctxGetCurrent()
            if current != context:
                if current:  # another device's (or context's): its thread, not this one
                    turn.release()
                    return None
                driver.ctxSetCurrent(context)
                # Device 0's primary context stays: it is what the CUDA runtime makes current
                # on a thread's first call anyway. Another device's is lent for the turn only.
                self._borrowed = self.device_index != 0
            _holder.thread = self
            return queued
        except BaseException as exc:  # a driver error (the thread will meet it), an interrupt
            # (wherever it lands, the turn is not kept: an RLock knows whether it is held)
            if turn._is_owned():  # type: ignore[attr-defined]
                _holder.thread = None
                self._give_back()
            if isinstance(exc, Exception):
                return None
            raise

    def leave(self) -> None:
        """Give back the turn :meth:`enter` took (and a lent context)."""
        _holder.thread = None
        if self._borrowed:
            self._give_back()
        else:
            self._turn.release()

    def _give_back(self) -> None:
        try:
            if self._borrowed:
                self._borrowed = False
                self._driver.ctxSetCurrent(0)
        except Exception:  # nothing to give back then
            _log.debug("cannot unset the CUDA context of a caller's thread", exc_info=True)
        finally:
            self._turn.release()

    def start_trace(
        self,
        clock: Callable[[], float] = time.perf_counter,
        turns: list[tuple[float, float]] | None = None,
    ) -> list[tuple[float, float, float]]:
        """Until :meth:`stop_trace`, time each closure queued: the list returned gets one
        ``(queued, started, ended)`` of ``clock`` per closure, in the order they run (appended
        as they end; ``queued`` is read on the submitting thread, the others on this one: with
        a per-thread clock such as ``time.thread_time``, ``ended - started`` is this thread's
        CPU time in the closure). Given ``turns``, each turn a caller takes to launch in place
        (:meth:`enter` to :meth:`leave`) appends ``(entered, left)`` to it. For the step
        timeline (``accelkit_cuda.timeline``) and the benchmarks' submission-thread figure:
        the wrapped methods are attributes of this instance, so nothing costs anything while
        no trace runs; while one does, each closure costs three clock reads and a wrapper."""
        trace: list[tuple[float, float, float]] = []
        cls = SubmissionThread
        plain = cls.submit

        def submit(fn: Callable[[], None], owner: object = None) -> None:
            queued = clock()

            def timed() -> None:
                started = clock()
                try:
                    fn()
                finally:
                    trace.append((queued, started, clock()))

            plain(self, timed, owner)

        self.__dict__["submit"] = submit
        if turns is not None:
            entered = [0.0]  # one turn at a time

            def enter() -> int | None:
                t = clock()
                queued = cls.enter(self)
                if queued is not None:
                    entered[0] = t
                return queued

            def leave() -> None:
                start = entered[0]  # (read in the turn: the next holder may set it after)
                try:
                    cls.leave(self)
                finally:
                    turns.append((start, clock()))

            self.__dict__["enter"] = enter
            self.__dict__["leave"] = leave
        return trace

    def stop_trace(self) -> None:
        """End :meth:`start_trace` (closures already queued are still timed)."""
        for name in ("submit", "enter", "leave"):
            self.__dict__.pop(name, None)

    def _work(self) -> None:
        self.ident = threading.get_ident()
        _holder.thread = self
        import cupy

        try:
            cupy.cuda.Device(self.device_index).use()
        except Exception:  # reported by the first call that needs the device
            _log.debug("cannot make cuda:%d current", self.device_index, exc_info=True)
        held = self._turn
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._bell.wait(self._lock)
                if not self._queue:
                    return
                # All that is queued, in one round: one lock round trip per batch, not per
                # closure (closures queued meanwhile wait for the next round, in order).
                batch = self._batch = self._queue
                self._queue = deque()
                self.rounds += 1
            with held:
                while batch:
                    fn = batch.popleft()[0]  # dropped once run: what it keeps alive goes too
                    self.started += 1
                    try:
                        fn()
                    except BaseException:  # a closure reports its own errors: a bug guard
                        _log.exception("work on the CUDA submission thread failed")
                    del fn
                if not self.context:
                    self.context = self._context()

    def _context(self) -> int:
        """The thread's current CUDA context (0 where it cannot be read)."""
        try:
            import cupy

            self._driver = cupy.cuda.driver
            return int(self._driver.ctxGetCurrent())
        except Exception:
            return 0

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the thread (after the work queued so far) and return its result; the
        loop waits without blocking. Cancelling the wait does not stop ``fn``."""
        box: list[Any] = []
        done = threading.Event()
        callbacks: list[Callable[[], None]] = []
        lock = threading.Lock()
        gone: list[bool] = []  # the wait ended without the result (cancelled)

        def run() -> None:
            outcome: tuple[bool, Any]
            try:
                outcome = (True, fn())
            except BaseException as exc:
                outcome = (False, exc)
            with lock:
                if not gone:
                    box.append(outcome)
                done.set()
                ready = list(callbacks)
            del outcome  # (dropped here, on the thread, when nobody waits for it any more)
            for cb in ready:
                cb()

        def register(cb: Callable[[], None]) -> Callable[[], None] | None:
            with lock:
                if not done.is_set():
                    callbacks.append(cb)
                    return lambda: _remove(callbacks, lock, cb)
            cb()
            return None

        self.submit(run)
        try:
            await wait_for_callback(register)
        except BaseException:
            # Cancelled while waiting: the result is dropped on the thread, never here (a CuPy
            # module's or array's destructor is a CUDA call, which the loop's thread never makes).
            with lock:
                gone.append(True)
                late = box[:]
                box.clear()
            if late:
                self.submit(late.clear)
                del late
            raise
        ok, value = box[0]
        if not ok:
            try:
                raise value
            finally:
                del value, box
        result: T = value
        return result

    def call_blocking(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """:meth:`call` for synchronous callers (``numpy()``, blocking waits). A caller in the
        thread's turn (code a launch in place runs, such as a finalizer) runs ``fn`` itself: the
        thread cannot run it before the turn is given back. With ``timeout`` (seconds),
        TimeoutError where ``fn`` has not run by then (it still runs when its turn comes)."""
        if self.on_thread() or _holder.thread is self:
            return fn()
        box: list[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

        self.submit(run)
        if not done.wait(timeout):
            raise TimeoutError(
                f"the submission thread of {self.name} did not run it in {timeout} s"
            )
        ok, value = box[0]
        if not ok:
            raise value
        result: T = value
        return result

    def close(self) -> None:
        """Run what is queued, then end the thread (blocking: call it off the loop)."""
        with self._lock:
            self._closed = True
            self._bell.ring()
            thread = self._thread
        if thread is not None and not self.on_thread():
            thread.join(_JOIN_TIMEOUT)

    @property
    def closed(self) -> bool:
        return self._closed


def _remove(callbacks: list[Callable[[], None]], lock: threading.Lock, cb: Any) -> None:
    with lock:
        if cb in callbacks:
            callbacks.remove(cb)


def _guarded(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except BaseException:  # a closure reports its own errors; this is a bug guard
            _log.exception("work on the CUDA submission thread failed")

    return run
