"""``IsolatedBackend``: any registered backend, run in a supervised worker process.

``accelkit.open_backend("cuda", isolate=True)`` opens one. The user's process keeps the core's
facades (validation and shape inference run here, as for every backend); below them, the
kernel objects, memory kernels, executor and streams of this backend's ``Opened`` record are
proxies that send each call to the worker (:mod:`accelkit._core.isolation.worker`), where the
real backend is opened. A tensor here holds a handle naming the worker's tensor; a call is
queued in order, without waiting for a reply, and gets a position on its proxy stream; the queue
is written when the event loop next turns (or every :data:`_BATCH` messages); the worker reports
positions as the real work completes, and awaits wait for those. A read is written at once with
the positions of its writers: the worker waits for them and answers with their completion and
the data together (one round trip). Host transfers of at least
:data:`~accelkit._core.isolation.proto.SHM_THRESHOLD` bytes go through a shared-memory segment;
smaller ones are pickled.

When the worker dies (a signal, an abort), reports a sticky device error, or makes no progress
for ``deadline`` seconds while work is pending (an idle worker is pinged, so that counts too),
every pending await raises
:class:`~accelkit.errors.WorkerLostError` naming the cause and the worker's last stderr lines,
the backend fails (its components say why), every handle from before goes stale (the
generation grows), and ``await backend.recover()`` starts a new worker (rate-limited). With
``auto_recover=True`` a new worker is started at once, on a thread of its own, after a fault.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import io
import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import anyio
import numpy as np

from accelkit._core.child import signal_name
from accelkit._core.device_errors import DeviceErrors
from accelkit._core.env import env_seconds
from accelkit._core.isolation import faults
from accelkit._core.isolation import worker as _worker
from accelkit._core.isolation.proto import SHM_THRESHOLD, Segment, decode_error
from accelkit._core.loop import wait_for_callback
from accelkit._core.pool import CachingPool
from accelkit._core.positions import PositionEvent, PositionStream, Waiters
from accelkit._core.stream_backend import Opened, StreamBackend
from accelkit.abc.kernels import KernelExecutor, KernelHandle, KernelInfo
from accelkit.abc.memory import DeviceBuffer
from accelkit.abc.stream import Event
from accelkit.capabilities import BackendCapabilities, BackendStatus, LifecycleState
from accelkit.device import Device
from accelkit.dtype import DType
from accelkit.errors import (
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    StaleHandleError,
    UnsupportedOperationError,
    WorkerLostError,
)
from accelkit.memory import MemoryInfo, MemoryPoolConfig
from accelkit.sdk.kernels import FactoryKernels, FusedKernels, MemoryKernels, TensorKernels
from accelkit.sdk.tensors import pending_writes
from accelkit.tensor import Tensor

__all__ = ["IsolatedBackend", "IsoStream"]

#: Seconds a stop waits for the reader to report a loss a failed send found (it does at once).
_SETTLE_S = 10.0
#: Default seconds without progress, while work is pending, before the worker counts as hung.
DEFAULT_DEADLINE = 300.0
#: At most this many restarts (``recover``) ...
MAX_RESTARTS = 5
#: ... within this many seconds.
RESTART_WINDOW = 60.0
_STDERR_LINES = 60
#: The socket buffers asked for on both ends (the system may give less): the writes of the
#: event loop's thread do not wait for the worker to read.
_SOCK_BUF = 4 << 20
#: Queued messages are written once this many wait (see ``_Link.call``).
_BATCH = 256
_READY = LifecycleState.READY


def deadline_s() -> float:
    """The hang deadline ``ACCELKIT_ISOLATE_DEADLINE_S`` sets (seconds; 0: never), strictly
    parsed ('5s' and 'five' became 300, -1 killed the watchdog thread, NaN turned it off)."""
    return env_seconds("ACCELKIT_ISOLATE_DEADLINE_S", DEFAULT_DEADLINE)


# -- the pipe to the worker ------------------------------------------------------------------------
def _reduce_tensor(t: Tensor) -> tuple[Any, ...]:
    return (_worker.ref_tensor, (t._data.tid,))


def _reduce_buffer(b: DeviceBuffer) -> tuple[Any, ...]:
    return (_worker.ref_buffer, (b.handle,))


#: Tensors and buffers of the isolated backend pickle as references to the worker's (resolved
#: there as they are unpickled); a dispatch table costs nothing for the other objects.
_DISPATCH = {Tensor: _reduce_tensor, DeviceBuffer: _reduce_buffer}


def _dumps(msgs: list[Any]) -> bytes:
    f = io.BytesIO()
    p = pickle.Pickler(f, protocol=pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _DISPATCH  # type: ignore[assignment]
    p.dump(msgs)
    return f.getvalue()


class _Pending:
    """A request's reply, waited for from a thread or a loop."""

    __slots__ = ("callbacks", "done", "error", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[], None]] = []

    def settle(self, ok: bool, value: Any, error: BaseException | None) -> None:
        self.ok, self.value, self.error = ok, value, error
        self.done.set()
        for cb in self.callbacks:
            cb()

    def add(self, cb: Callable[[], None]) -> Callable[[], None] | None:
        self.callbacks.append(cb)
        if self.done.is_set():
            with contextlib.suppress(ValueError):
                self.callbacks.remove(cb)
            cb()
            return None
        return lambda: self.callbacks.remove(cb) if cb in self.callbacks else None

    def result(self) -> Any:
        if self.error is not None:
            raise _fresh(self.error)
        return self.value


def _same(exc: BaseException) -> BaseException:
    """A check (DeviceErrors) whose error the worker already found."""
    return exc


def _fresh(exc: BaseException) -> BaseException:
    """A new instance of a shared error, so that tasks raising it concurrently do not share a
    traceback."""
    if isinstance(exc, WorkerLostError):
        return WorkerLostError(str(exc), cause=exc.cause, stderr_tail=exc.stderr_tail)
    return exc


def _never() -> bool:
    return False


def _ignore(_fn: Callable[[], None]) -> None:
    return None


def _loop_binding() -> tuple[Callable[[], bool], Callable[[Callable[[], None]], Any]]:
    """For the running event loop: a cheap test that the caller runs on it, and how to
    schedule a callback there from its own thread."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def on_trio() -> bool:
            try:
                return trio.lowlevel.current_trio_token() is token
            except RuntimeError:
                return False

        return on_trio, token.run_sync_soon
    import asyncio

    loop = asyncio.get_running_loop()
    get_loop = asyncio._get_running_loop
    return (lambda: get_loop() is loop), loop.call_soon


class _Link:
    """The pipe to one worker process, its reader and watchdog threads, and its fault state."""

    def __init__(self, owner: IsolatedBackend) -> None:
        self.owner = owner
        fd, self.stderr_path = tempfile.mkstemp(prefix="accelkit-iso-", suffix=".stderr")
        ours, theirs = socket.socketpair()
        try:
            # A fresh interpreter (never a fork: a forked driver is undefined), which imports
            # nothing of the user's main module (multiprocessing's spawn would).
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from accelkit._core.isolation.worker import main; main()",
                    str(theirs.fileno()),
                    str(os.getpid()),
                    json.dumps(sys.path),
                ],
                stdin=subprocess.DEVNULL,
                stderr=fd,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
        finally:
            os.close(fd)
            theirs.close()
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):  # a batch is written without waiting
            with contextlib.suppress(OSError):
                ours.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)
        self.conn = Connection(ours.detach())
        self.lock = threading.Lock()  # sends, positions, the queued messages
        self.queued: list[Any] = []
        self.drops: collections.deque[int] = collections.deque()
        self.buf_drops: collections.deque[int] = collections.deque()
        self.drops_events: collections.deque[int] = collections.deque()
        self.requests: dict[int, _Pending] = {}
        #: Requests that may take long without counting as a hang (opening, compiling).
        self.slow: set[int] = set()
        self.req_ids = itertools.count(1)
        self.streams: dict[int, IsoStream] = {}
        self.segments: set[Segment] = set()
        self.inflight_segments: collections.deque[tuple[IsoStream, int, Segment]] = (
            collections.deque()
        )
        self.fault: WorkerLostError | None = None
        #: Whether ``lost`` has run (a failed send sets ``fault`` before it does).
        self.lost_reported = False
        self.closing = False
        self.last_progress = self.last_ping = time.monotonic()
        self.deadline = owner.deadline
        self.flush_wake = threading.Condition(self.lock)
        self.flush_scheduled = False
        self.on_loop: Callable[[], bool] = _never
        self.call_soon: Callable[[Callable[[], None]], Any] = _ignore
        self.flusher = threading.Thread(
            target=self._flusher, daemon=True, name="accelkit-iso-flusher"
        )
        self.flusher.start()
        self.reader = threading.Thread(target=self._read, daemon=True, name="accelkit-iso-reader")
        self.reader.start()
        self.watchdog = threading.Thread(
            target=self._watch, daemon=True, name="accelkit-iso-watchdog"
        )
        self.watchdog.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    # -- sending ----------------------------------------------------------------------------------
    # Messages are queued in order and written in batches: when someone waits (a read, an
    # await of a position, a request), and otherwise within about a millisecond (the flusher
    # thread), so that a run of small submissions costs the caller a list append each.
    def _check_locked(self) -> None:
        if self.fault is not None:
            raise _fresh(self.fault)

    def queue(self, msg: Any) -> None:
        """Queue ``msg`` (in order; written with the next batch)."""
        with self.lock:
            self._check_locked()
            self._queue_locked(msg)

    def bind_loop(
        self, binding: tuple[Callable[[], bool], Callable[[Callable[[], None]], Any]]
    ) -> None:
        """Flush from this event loop (``binding``: whether the caller runs on it, and how to
        schedule a callback there, see :func:`_loop_binding`)."""
        self.on_loop, self.call_soon = binding

    def _loop_flush(self) -> None:
        self.flush_scheduled = False
        with contextlib.suppress(Exception):  # a fault: the awaits say so
            self.flush()

    def _queue_locked(self, msg: Any) -> None:
        queued = self.queued
        if not queued:
            # The first message of a batch: on the event loop, the batch is written when the
            # loop next turns (after the current task yields, or at its await: one write for a
            # submission and its read); elsewhere by the flusher thread.
            if self.on_loop():
                if not self.flush_scheduled:
                    self.flush_scheduled = True
                    self.call_soon(self._loop_flush)
            else:
                self.flush_wake.notify()
        # A handle's death goes in the order it happened: after what was queued before it (a
        # view queued earlier may still name it), before what follows (a reused block is new).
        if self.drops or self.buf_drops:
            tids = [self.drops.popleft() for _ in range(len(self.drops))]
            bids = [self.buf_drops.popleft() for _ in range(len(self.buf_drops))]
            eids = [self.drops_events.popleft() for _ in range(len(self.drops_events))]
            queued.append(("x", tids, bids, eids))
        queued.append(msg)

    def _flush_locked(self) -> None:
        if self.drops or self.buf_drops:
            self._queue_locked(("x", [], [], []))  # moves the drops in
            self.queued.pop()
        if not self.queued:
            return
        msgs = self.queued
        self.queued = []
        try:
            data = _dumps(msgs)
        except Exception:
            data = b"".join(_dumps([m]) if _picklable(m) else _dumps([_refused(m)]) for m in msgs)
        try:
            self.conn.send_bytes(data)
        except (OSError, ValueError) as exc:
            err = WorkerLostError(
                f"the isolated {self.owner.name} worker cannot be reached: {exc}",
                cause="pipe closed",
            )
            if self.fault is None:
                # The link is faulty from now on, not once the reader has seen the pipe's end
                # (it then says why, and fails the streams): a shutdown in between waited on
                # the streams through this pipe, and raised this error.
                self.fault = err
                self.flush_wake.notify_all()  # the flusher ends
            raise _fresh(err) from None

    def flush(self) -> None:
        """Write what is queued now."""
        if self.queued or self.drops or self.buf_drops:
            with self.lock:
                if self.fault is None:
                    self._flush_locked()

    def _flusher(self) -> None:
        while True:
            with self.lock:
                while not self.queued and not self.closing and self.fault is None:
                    self.flush_wake.wait()
                if self.closing or self.fault is not None:
                    return
            time.sleep(0.0005)  # let a run of submissions gather
            with contextlib.suppress(Exception):
                self.flush()

    def send(self, msg: Any) -> None:
        """Queue ``msg`` and write it now, with everything before it."""
        with self.lock:
            self._check_locked()
            self._queue_locked(msg)
            self._flush_locked()

    def call(self, stream: IsoStream, msg_tail: tuple[Any, ...], op: str = "c") -> int:
        """Queue a call on ``stream``; returns its position there (written with the next
        batch, see :meth:`_queue_locked`, or at once when :data:`_BATCH` messages wait)."""
        with self.lock:
            if stream.closed:  # first: a closed stream says so, whatever became of the link
                raise _closed_error(stream)
            self._check_locked()
            seq = stream.submitted + 1
            self._queue_locked((op, stream.sid, seq, *msg_tail))
            stream.submitted = seq
            if len(self.queued) >= _BATCH:
                self._flush_locked()
            return seq

    def request(self, what: str, *args: Any) -> _Pending:
        pending = _Pending()
        with self.lock:
            req = next(self.req_ids)
            self.requests[req] = pending
            if what in ("open", "load_kernel"):
                self.slow.add(req)
            try:
                self._check_locked()
                self._queue_locked(("q", req, what, *args))
                self._flush_locked()
            except BaseException:
                self.requests.pop(req, None)
                raise
        return pending

    async def ask(self, what: str, *args: Any) -> Any:
        pending = self.request(what, *args)
        if not pending.done.is_set():
            await wait_for_callback(pending.add)
        return pending.result()

    def ask_blocking(self, what: str, *args: Any, timeout: float | None = None) -> Any:
        pending = self.request(what, *args)
        if not pending.done.wait(timeout):
            raise DeviceError(f"the isolated {self.owner.name} worker did not answer {what!r}")
        return pending.result()

    # -- receiving --------------------------------------------------------------------------------
    def _read(self) -> None:
        conn = self.conn
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                break
            self.last_progress = time.monotonic()
            for msg in pickle.loads(data):  # a list: what one batch of the worker sent
                kind = msg[0]
                if kind == "D":
                    for _, sid, seq, errs in msg[1]:
                        stream = self.streams.get(sid)
                        if stream is not None:
                            stream.complete(
                                seq, [(s, decode_error(e, stream.name)) for s, e in errs]
                            )
                elif kind == "r":
                    _, req, ok, value = msg
                    pending = self.requests.pop(req, None)
                    self.slow.discard(req)
                    if pending is not None:
                        err = None if ok else decode_error(value, f"the {self.owner.name} worker")
                        pending.settle(ok, value if ok else None, err)
                elif kind == "F":
                    self.lost(f"a sticky device error: {msg[1]}", cause=msg[1], kill=True)
                    return
        if not self.closing:
            self.lost(None, cause="")

    def _watch(self) -> None:
        """The hang watchdog: work pending without progress for ``deadline`` seconds is a hang.
        While idle, the worker is pinged every ``deadline / 2`` seconds (at most 30 s): an
        unanswered ping is pending work, so a worker that hangs while idle is found too."""
        while not self.closing and self.fault is None:
            deadline = self.deadline
            time.sleep(min(0.25, deadline / 4) if deadline else 0.25)
            if self.closing or self.fault is not None:
                return
            busy = len(self.requests) > len(self.slow) or any(
                s.submitted > s.completed for s in self.streams.values()
            )
            now = time.monotonic()
            if not busy:
                if deadline and not self.requests and now - self.last_ping >= min(deadline / 2, 30):
                    self.last_ping = now
                    with contextlib.suppress(Exception):  # a fault: the reader says so
                        self.request("ping")
                self.last_progress = now
            elif deadline and now - self.last_progress > deadline:
                self.lost(
                    f"hung: no progress for {now - self.last_progress:.1f} s with work pending"
                    f" (deadline {deadline:g} s); it was killed",
                    cause="hang",
                    kill=True,
                )
                return

    def stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 16384))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in lines[-_STDERR_LINES:])

    def lost(self, reason: str | None, *, cause: str, kill: bool = False) -> None:
        """The worker is gone (or is killed now): fail everything pending, say why."""
        with self.lock:
            if self.lost_reported or self.closing:
                return
            self.lost_reported = True
            if self.fault is None:  # (a failed send may have set it)
                # Refuse new sends at once (the message below replaces this one).
                self.fault = WorkerLostError(
                    f"the isolated {self.owner.name} worker (pid {self.proc.pid}) was lost",
                    cause=cause,
                )
            self.flush_wake.notify_all()  # the flusher ends
        if kill and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)
        code = self.proc.returncode
        if reason is None:
            if code is not None and code < 0:
                cause = signal_name(code)
                reason = f"killed by {cause}"
            else:
                cause = f"exit status {code}"
                reason = f"exited with status {code}"
        tail = self.stderr_tail()
        from accelkit._core.child import crash_line

        line = crash_line(tail) if tail else ""
        message = (
            f"the isolated {self.owner.name} worker (pid {self.proc.pid}) was lost: {reason}"
            + (f" ({line})" if line and line not in reason else "")
            + (f"; its last stderr lines:\n{tail}" if tail else "")
            + "\nawait backend.recover() starts a new worker"
        )
        fault = WorkerLostError(message, cause=cause, stderr_tail=tail)
        self.fault = fault
        self.owner._on_fault(fault)  # the backend fails first: an await woken below sees it
        for stream in list(self.streams.values()):
            stream.fail(fault)
        for req in list(self.requests):
            pending = self.requests.pop(req, None)
            if pending is not None:
                pending.settle(False, None, fault)
        self.cleanup_segments()

    def settle_loss(self, timeout: float | None = None) -> None:
        """After a failed send faulted the link, before it is stopped (a shutdown, a recover):
        let the reader say why and fail the streams, as it does once it sees the pipe's end
        (a stopped link's reader says nothing: the awaits of other tasks hung); if it has not
        within ``timeout`` seconds, do it here. Blocking."""
        if self.fault is None or self.lost_reported:
            return
        self.reader.join(_SETTLE_S if timeout is None else timeout)
        if not self.lost_reported:
            self.lost("its pipe is closed", cause="pipe closed", kill=True)

    def prune_segments(self) -> None:
        """Forget the segments of uploads that completed (the worker unlinked them)."""
        q = self.inflight_segments
        while q and q[0][0].completed >= q[0][1]:
            self.segments.discard(q.popleft()[2])

    def cleanup_segments(self) -> None:
        for seg in list(self.segments):
            seg.unlink()
        self.segments.clear()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker (it was asked to shut down, or is killed now) and release it."""
        with self.lock:
            self.closing = True
            self.flush_wake.notify_all()  # the flusher ends (it waited for good: a thread a link)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5.0)
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.reader is not threading.current_thread():
            self.reader.join(5.0)
        self.cleanup_segments()
        with contextlib.suppress(OSError):
            os.unlink(self.stderr_path)


#: Idle workers, by backend spec, kept for the next open where ``ACCELKIT_ISOLATE_SPARE=1``
#: (the conformance suite opens a backend per test; a worker takes a second or more to start).
_spares: dict[str, list[_Link]] = {}
_spares_lock = threading.Lock()


def _spares_wanted() -> bool:
    return os.environ.get("ACCELKIT_ISOLATE_SPARE", "").strip() not in ("", "0")


def _put_spare(spec: str, link: _Link) -> bool:
    with _spares_lock:
        kept = _spares.setdefault(spec, [])
        if len(kept) >= 2:
            return False
        link.streams.clear()
        link.requests.clear()
        link.cleanup_segments()
        kept.append(link)
        return True


def _take_spare(owner: IsolatedBackend) -> _Link | None:
    with _spares_lock:
        kept = _spares.get(owner.inner, [])
        while kept:
            link = kept.pop()
            if link.fault is None and link.proc.poll() is None:
                link.owner = owner
                link.deadline = owner.deadline
                link.last_progress = time.monotonic()
                return link
    return None


def close_spares() -> None:
    """Stop every idle worker kept for reuse (``ACCELKIT_ISOLATE_SPARE``)."""
    with _spares_lock:
        links = [link for kept in _spares.values() for link in kept]
        _spares.clear()
    for link in links:
        with contextlib.suppress(Exception):
            link.send(("q", 0, "shutdown", False))
        link.close(5.0)


def _picklable(msg: Any) -> bool:
    try:
        _dumps([msg])
    except Exception:
        return False
    return True


def _refused(msg: Any) -> Any:
    """What replaces a call that cannot be pickled: its position fails with the reason."""
    text = f"the arguments of {msg[0]!r} cannot be sent to the worker process (not picklable)"
    if msg[0] in ("c", "cp", "we"):
        return ("bad", msg[1], msg[2], text)
    return ("x", [], [], [])


class _Handle:
    """What a tensor of an isolated backend holds as its storage: the id of the worker's
    tensor, dropped there when the last reference here dies."""

    __slots__ = ("drops", "tid")

    def __init__(self, tid: int, drops: collections.deque[int]) -> None:
        self.tid = tid
        self.drops = drops

    def __del__(self) -> None:
        self.drops.append(self.tid)

    def __repr__(self) -> str:
        return f"<isolated tensor {self.tid}>"


# -- streams and events ------------------------------------------------------------------------------
class IsoStream(DeviceErrors, PositionStream):
    """A stream of an isolated backend: positions handed out here, completed when the worker
    reports the real work done."""

    submitted: int
    completed: int

    def __init__(self, link: _Link, sid: int, device: Device, name: str) -> None:
        self.link = link
        self.sid = sid
        self._device = device
        self.name = name
        self.submitted = 0
        self.completed = 0
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._waiters = Waiters(self._lock)
        self.checks = []  # the worker's errors, by position (DeviceErrors)
        self._fault: WorkerLostError | None = None
        self._fault_after = 0
        #: Set by :meth:`close` (shutdown), under the link's lock: work is refused from then on.
        self.closed = False
        link.streams[sid] = self

    @property
    def device(self) -> Device:
        return self._device

    def __repr__(self) -> str:
        return f"IsoStream({self.name!r}, submitted={self.submitted}, completed={self.completed})"

    def complete(self, seq: int, errors: list[tuple[int, BaseException]]) -> None:
        with self._lock:
            for err_seq, exc in errors:  # the lock is held: add_check would take it again
                self.checks.append((err_seq, functools.partial(_same, exc)))
            if seq > self.completed:
                self.completed = seq
            self._cv.notify_all()
            ready = self._waiters.due(self.completed) if self._waiters else []
        for cb in ready:
            cb()

    def fail(self, fault: WorkerLostError) -> None:
        with self._lock:
            self._fault = fault
            self._fault_after = self.completed
            self.completed = max(self.completed, self.submitted)
            self._cv.notify_all()
            ready = self._waiters.due(1 << 62)
        for cb in ready:
            cb()

    def add_waiter(self, seq: int, callback: Callable[[], None]) -> Callable[[], None] | None:
        if self.completed < seq:
            self.link.flush()
        return self._waiters.add(seq, callback, lambda: self.completed)

    def wait_for_blocking(self, seq: int) -> None:
        if self.completed < seq:
            self.link.flush()
        with self._lock:
            while self.completed < seq:
                self._cv.wait()
        self.raise_errors(seq)

    def raise_errors(self, seq: int) -> None:
        if self._fault is not None and seq > self._fault_after:
            raise _fresh(self._fault)
        super().raise_errors(seq)

    def close(self) -> None:
        """Refuse work from now on, once the work submitted so far has completed (blocking:
        shutdown calls it off the loop; at most a minute). The link may serve another backend
        next (a spare worker): nothing of this stream may reach it."""
        with self.link.lock:
            self.closed = True
            target = self.submitted
        if self.completed < target:
            with contextlib.suppress(Exception):  # a lost worker fails the positions instead
                self.link.flush()
        deadline = time.monotonic() + 60.0
        with self._lock:
            while self.completed < target and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)

    def record_event(self) -> IsoEvent:
        if self.closed:
            raise _closed_error(self)
        eid = next(_event_ids)
        self.link.send(("ev", self.sid, eid))
        return IsoEvent(self, self.submitted, eid)

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, IsoEvent) or event._stream.link is not self.link:
            raise InvalidArgumentError(
                f"expected an event of this isolated backend; got {type(event).__name__}"
            )
        if self.closed:
            raise _closed_error(self)
        if event.query() or event._stream is self:
            return
        self.link.call(self, (event.eid,), op="we")


def _closed_error(stream: IsoStream) -> StaleHandleError:
    return StaleHandleError(
        f"{stream.name}: the stream was closed (its backend was shut down, or is shutting down)"
    )


_event_ids = itertools.count(1)


class IsoEvent(PositionEvent[IsoStream]):
    """A position of an :class:`IsoStream`, recorded in the worker too."""

    __slots__ = ("eid",)

    def __init__(self, stream: IsoStream, seq: int, eid: int) -> None:
        super().__init__(stream, seq)
        self.eid = eid

    def __del__(self) -> None:
        link = self._stream.link
        if link.fault is None and not link.closing:
            link.drops_events.append(self.eid)


# -- the pool --------------------------------------------------------------------------------------
class _ProxyPool(CachingPool):
    """The user process's count of the worker's memory: the same size classes, limits and
    statistics as the real pool; a block here is an id naming the worker's buffer."""

    def __init__(self, link: _Link, device: Device, total: int, config: MemoryPoolConfig) -> None:
        ids = itertools.count(1)
        super().__init__(device, lambda _size: next(ids), link.buf_drops.append, total, config)
        self._link = link

    def allocate(self, nbytes: int, _again: bool = False) -> DeviceBuffer:
        """A raw allocation (``memory_manager.allocate``): the worker allocates it too."""
        buf = CachingPool.allocate(self, nbytes, _again)
        self._link.queue(("a", buf.handle, nbytes))
        return buf

    def release_later(self, buffer: DeviceBuffer) -> None:
        self._link.buf_drops.append(buffer.handle)
        super().release_later(buffer)


# -- kernel objects ----------------------------------------------------------------------------------
_OUTPUT_NAMES = frozenset({"out", "loss", "probs", "normed", "summed"})
_IN_PLACE = {"adam_update": ("param", "m", "v")}


class _Proxy:
    """Allocation and calls, shared by the three proxy kernel objects."""

    _kind = ""

    def __init__(self, backend: IsolatedBackend, link: _Link) -> None:
        self.backend = backend
        self._link = link

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        backend = self.backend
        size = 1
        for d in shape:
            size *= d
        pool = backend._pool
        if pool is None:
            pool = backend.pool
        buf = CachingPool.allocate(pool, size * dtype.itemsize)
        rec = backend._capture
        if rec is not None:  # new memory for a capture (past its watch of pool.allocate)
            rec.fresh.add(buf)
        stream: Any = backend._stream_var.get() or backend._default
        link = self._link
        tid = next(_tensor_ids)
        link.queue(("e", tid, buf.handle, shape, dtype, self._kind, stream.sid))
        handle = _Handle(tid, link.drops)
        return Tensor(backend, buf, handle, shape, dtype, stream.device, size, stream, 0)

    def view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        tid = next(_tensor_ids)
        link = self._link
        link.queue(("v", tid, x._data.tid, shape, self._kind))
        return Tensor(
            x._backend, x._buffer, _Handle(tid, link.drops), shape, x._dtype, x._device,
            x._size, x._stream, x._seq,
        )  # fmt: skip


_tensor_ids = itertools.count(1)


def _make_method(kind: str, name: str, base: type) -> Callable[..., None]:
    params = list(inspect.signature(getattr(base, name)).parameters)[1:]
    outs = _IN_PLACE.get(name) or tuple(p for p in params if p in _OUTPUT_NAMES)
    where = tuple((params.index(p), p) for p in outs)

    def method(self: Any, *args: Any, **kwargs: Any) -> None:
        backend = self.backend
        stream = backend._stream_var.get() or backend._default
        seq = self._link.call(stream, (kind, name, args, kwargs))
        write = (stream, seq)
        for i, p in where:
            o = args[i] if i < len(args) else kwargs.get(p)
            if o is not None:
                o._stream = stream
                o._seq = seq
                o._buffer.last_write = write

    method.__name__ = name
    method.__qualname__ = f"Isolated.{name}"
    return method


_TENSOR_METHODS = (
    "unary", "binary", "where", "cast", "gemm", "matmul", "linear", "reduce", "permute", "concat",
    "narrow", "gather", "scatter", "conv2d", "attention", "softmax", "layer_norm", "rms_norm",
    "cross_entropy", "embedding", "adam_update", "depthwise", "separable_filter",
    "sobel_magnitude", "grayscale", "take", "cumulative", "argsort", "scatter_reduce",
)  # fmt: skip


class _ProxyTensorKernels(_Proxy, TensorKernels):
    _kind = "t"

    def overrides(self, name: str) -> bool:
        TensorKernels.overrides(self, name)  # refuses an unknown name
        # attention_bshd may decline a call by raising, which a queued call cannot report in
        # time for the core to permute instead: isolated, the core always permutes.
        return name != "attention_bshd" and name in self.backend._info["overrides"]


for _name in _TENSOR_METHODS:
    setattr(_ProxyTensorKernels, _name, _make_method("t", _name, TensorKernels))
_ProxyTensorKernels.__abstractmethods__ = frozenset()


class _ProxyFactoryKernels(_Proxy, FactoryKernels):
    _kind = "f"

    @property
    def device_random(self) -> bool:
        return bool(self.backend._info["device_random"])

    def from_host(self, out: Tensor, array: np.ndarray[Any, Any]) -> None:
        backend = self.backend
        stream: Any = backend._stream_var.get() or backend._default
        link = self._link
        if array.nbytes >= SHM_THRESHOLD:
            link.prune_segments()
            seg = Segment(array.nbytes)
            view = seg.array()
            np.copyto(view.view(array.dtype).reshape(array.shape), array)
            del view
            seg.map.close()
            link.segments.add(seg)
            args = (out, seg.path, array.dtype.str, array.shape)
            seq = link.call(stream, ("F", "from_host", args, {}))
            link.inflight_segments.append((stream, seq, seg))
        else:
            seq = link.call(stream, ("f", "from_host", (out, np.array(array)), {}))
        out._stream = stream
        out._seq = seq
        out._buffer.last_write = (stream, seq)

    def random(self, out: Tensor, draw: Any) -> None:
        if self.device_random:
            _device_random(self, out, draw)
        else:
            self.generate(out, draw.host)


_device_random = _make_method("f", "random", FactoryKernels)
_ProxyFactoryKernels.fill = _make_method("f", "fill", FactoryKernels)  # type: ignore[method-assign]
_ProxyFactoryKernels.__abstractmethods__ = frozenset()


class _ProxyFusedKernels(_Proxy, FusedKernels):
    _kind = "k"

    @property
    def fused_ops(self) -> frozenset[str]:
        return frozenset(self.backend._info["fused_ops"])


for _name in FusedKernels.OPS:
    setattr(_ProxyFusedKernels, _name, _make_method("k", _name, FusedKernels))
_ProxyFusedKernels.__abstractmethods__ = frozenset()


class _ProxyExecutor(KernelExecutor):
    """The worker's kernel executor: compiles there, launches in stream order."""

    def __init__(self, backend: IsolatedBackend, link: _Link, languages: Sequence[str]) -> None:
        self.backend = backend
        self.languages = frozenset(languages)

    @property
    def _link(self) -> _Link:
        """The link to the worker now: an executor kept across a shutdown and a new initialize
        sent to the old, closed worker (the core's components are reused across sessions,
        :meth:`StreamBackend._component`; a backend's executor is its own)."""
        link = self.backend._link
        if link is None:
            self.backend.check_ready()  # NotInitializedError, saying why
            raise NotInitializedError(f"the isolated {self.backend.inner} backend has no worker")
        return link

    async def load_kernel(
        self, source: str, name: str, *, language: str, options: Sequence[str] = ()
    ) -> KernelHandle:
        handle: KernelHandle = await self._link.ask(
            "load_kernel", source, name, language, tuple(options)
        )
        return handle

    def execute_kernel(
        self, handle: KernelHandle, grid: Sequence[int], block: Sequence[int], args: Sequence[Any]
    ) -> None:
        backend = self.backend
        backend.check_ready()
        stream: Any = backend._stream_var.get() or backend._default
        args = list(args)
        seq = self._link.call(stream, ("e", "execute_kernel", (handle, grid, block, args), {}))
        write = (stream, seq)
        for a in args:  # any tensor a user kernel gets may be written
            if type(a) is Tensor:
                a._stream = stream
                a._seq = seq
                a._buffer.last_write = write

    def kernel_info(self, handle: KernelHandle) -> KernelInfo:
        info: KernelInfo = self._link.ask_blocking("kernel_info", handle, timeout=60.0)
        return info

    def unload_kernel(self, handle: KernelHandle) -> None:
        self._link.send(("q", 0, "unload_kernel", handle))


def _writes(tensor: Tensor | None, buffer: DeviceBuffer) -> list[tuple[IsoStream, int]]:
    """The positions a read of ``tensor`` (or of ``buffer``) waits for."""
    if tensor is not None:
        return pending_writes(tensor)  # type: ignore[return-value]
    return [buffer.last_write] if buffer.last_write is not None else []


class _ProxyMemoryKernels(MemoryKernels):
    # A read is sent at once with the positions of its writers; the worker waits for those and
    # reports them before it answers, so a read after a submission is one round trip. The
    # writers' errors are then raised here as on any stream.
    wait_for_writers = False

    def __init__(self, backend: IsolatedBackend, link: _Link, pool: _ProxyPool) -> None:
        super().__init__(backend, pool)
        self._link = link
        self._staged: dict[int, Segment] = {}

    def _stream(self) -> IsoStream:
        b = self.backend
        stream: IsoStream = b._stream_var.get() or b._default  # type: ignore[assignment]
        return stream

    def free(self, buffer: DeviceBuffer) -> None:
        bid = buffer.handle
        self._link.send(("f", self._stream().sid, buffer, bid))
        self.pool.free(buffer)

    async def stage(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if data.nbytes < SHM_THRESHOLD:
            return np.array(data)
        seg = Segment(data.nbytes)
        self._link.segments.add(seg)
        out = seg.array()
        await anyio.to_thread.run_sync(np.copyto, out, data)
        self._staged[id(out)] = seg
        return out

    async def write(
        self, buffer: DeviceBuffer, data: np.ndarray[Any, Any], dst: Tensor | None
    ) -> None:
        seg = self._staged.pop(id(data), None)
        payload: Any = data.tobytes() if seg is None else seg.path
        try:
            await self._link.ask("write", self._stream().sid, buffer, dst, payload, data.nbytes)
        finally:
            if seg is not None:
                seg.unlink()
                self._link.segments.discard(seg)

    async def _ask_read(self, writes: list[tuple[IsoStream, int]], *args: Any) -> Any:
        pending = self._link.request(
            *args,
            [(s.sid, q) for s, q in writes if s.completed < q],
        )
        if not pending.done.is_set():
            await wait_for_callback(pending.add)
        for stream, seq in writes:  # reported before the answer: their errors come first
            await stream.wait_for(seq)
        return pending.result()

    def _ask_read_blocking(self, writes: list[tuple[IsoStream, int]], *args: Any) -> Any:
        pending = self._link.request(
            *args,
            [(s.sid, q) for s, q in writes if s.completed < q],
        )
        pending.done.wait()
        for stream, seq in writes:
            stream.wait_for_blocking(seq)
        return pending.result()

    async def read(
        self, out: np.ndarray[Any, Any], buffer: DeviceBuffer, src: Tensor | None
    ) -> None:
        n = out.nbytes
        cur = self._stream()
        writes = [*_writes(src, buffer), (cur, cur.submitted)]
        if n < SHM_THRESHOLD:
            data = await self._ask_read(writes, "readb", buffer, src, n, None)
            out[...] = data
            return
        seg = Segment(n)
        self._link.segments.add(seg)
        try:
            await self._ask_read(writes, "readb", buffer, src, n, seg.path)
            await anyio.to_thread.run_sync(np.copyto, out, seg.array())
        finally:
            seg.unlink()
            self._link.segments.discard(seg)

    def copy(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int,
        dst_tensor: Tensor | None,
        src_tensor: Tensor | None,
    ) -> None:
        stream = self._stream()
        a = dst_tensor if dst_tensor is not None else dst
        b = src_tensor if src_tensor is not None else src
        seq = self._link.call(stream, (a, b), op="cp")
        if dst_tensor is not None:
            dst_tensor._stream = stream
            dst_tensor._seq = seq
        dst.last_write = (stream, seq)

    async def read_tensor(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        n = tensor.nbytes
        writes = pending_writes(tensor)
        if n < SHM_THRESHOLD:
            arr: np.ndarray[Any, Any] = await self._ask_read(
                writes,  # type: ignore[arg-type]
                "read", tensor, None,
            )  # fmt: skip
            return arr
        seg = Segment(n)
        self._link.segments.add(seg)
        try:
            await self._ask_read(writes, "read", tensor, seg.path)  # type: ignore[arg-type]
        finally:
            seg.unlink()
            self._link.segments.discard(seg)
        return seg.array().view(tensor.dtype.to_numpy()).reshape(tensor.shape)

    def read_tensor_blocking(self, tensor: Tensor) -> np.ndarray[Any, Any]:
        n = tensor.nbytes
        writes: Any = pending_writes(tensor)
        if n < SHM_THRESHOLD:
            arr: np.ndarray[Any, Any] = self._ask_read_blocking(writes, "read", tensor, None)
            return arr
        seg = Segment(n)
        self._link.segments.add(seg)
        try:
            self._ask_read_blocking(writes, "read", tensor, seg.path)
        finally:
            seg.unlink()
            self._link.segments.discard(seg)
        return seg.array().view(tensor.dtype.to_numpy()).reshape(tensor.shape)

    def dlpack_device(self, tensor: Tensor) -> tuple[int, int]:
        raise UnsupportedOperationError(
            f"tensors of the isolated {self.backend.name} backend do not export DLPack: their"
            " memory is in the worker process; use await tensor.to_host() (large arrays come"
            " through shared memory)"
        )

    def export_dlpack(self, tensor: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
        return self.dlpack_device(tensor)

    def settle(self) -> None:
        """Write what is queued: a queued message holds its tensors until it is written."""
        self._link.flush()


# -- the backend ------------------------------------------------------------------------------------
class IsolatedBackend(StreamBackend[IsoStream]):
    """Backend ``inner`` (a registered name, or ``"module:Class"``) run in a worker process
    (see the module docstring). Its ``name`` is the inner backend's; :attr:`isolated` is true.

    ``deadline``: seconds without progress, while work is pending, after which the worker
    counts as hung and is killed (``ACCELKIT_ISOLATE_DEADLINE_S``, default 300; 0: never);
    while idle, the worker is pinged every ``deadline / 2`` seconds (at most 30), so that a
    worker that hangs while idle is found too.
    ``auto_recover``: start a new worker by itself after a fault (within the rate limit).
    """

    isolated = True
    version = ""

    def __init__(
        self,
        inner: str,
        pool_config: MemoryPoolConfig | None = None,
        *,
        deadline: float | None = None,
        auto_recover: bool = False,
        max_restarts: int = MAX_RESTARTS,
        restart_window: float = RESTART_WINDOW,
    ) -> None:
        self.inner = inner
        if ":" in inner:  # an import path (tests, unregistered backends): its class names it
            from accelkit.registry import _import_path

            cls = _import_path(inner)
            self.name = cls.name  # type: ignore[misc]
            self.device_kinds = frozenset(cls.device_kinds)  # type: ignore[misc]
        else:
            from accelkit.registry import default_registry

            self.name = inner  # type: ignore[misc]
            self.device_kinds = frozenset(  # type: ignore[misc]
                default_registry.descriptor(inner).device_kinds
            )
        super().__init__(pool_config)
        if deadline is not None and not 0.0 <= deadline < float("inf"):
            raise InvalidArgumentError(f"deadline must be seconds >= 0 (0: never); got {deadline}")
        self.deadline = deadline if deadline is not None else deadline_s()
        self.auto_recover = auto_recover
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self._link: _Link | None = None
        self._info: dict[str, Any] = {}
        self._device_for_open: Device | None = None
        self._restarts: collections.deque[float] = collections.deque()
        #: The last fault (None before the first): what ``status`` and ``accelkit doctor`` show.
        self.last_fault: WorkerLostError | None = None
        #: The worker's ``memory_info().used`` when it was last shut down (None before).
        self.worker_used_at_shutdown: int | None = None
        self._sids = itertools.count(1)
        self._loop: tuple[Callable[[], bool], Callable[[Callable[[], None]], Any]] | None = None
        self._recover_thread: threading.Thread | None = None
        #: Inside recover(): a fault it settles starts no automatic recovery beside it.
        self._recovering = False
        self._recover_lock = threading.Lock()

    # -- hooks ------------------------------------------------------------------------------------
    def _device_count(self) -> int:
        return 1 << 16  # the worker says whether the device exists, when it opens it

    def supports_device(self, device: Device | str) -> bool:
        """Any device of the inner backend's kinds, by index or by address (``dask://...``):
        the worker says whether it can open it (the default refuses addresses, which an
        index-based backend cannot drive)."""
        try:
            return Device.parse(device).kind in self.device_kinds
        except InvalidArgumentError:
            return False

    def _device_capabilities(self, index: int) -> BackendCapabilities:
        if self._info:
            caps: BackendCapabilities = self._info["capabilities"]
            return caps
        if ":" in self.inner:
            from accelkit.registry import _import_path

            cls = _import_path(self.inner)
        else:
            from accelkit.registry import default_registry

            cls = default_registry.backend_class(self.inner)
        return cls().capabilities  # type: ignore[no-any-return]

    async def _initialize(self, device: Device) -> Opened[IsoStream]:
        self._device_for_open = device
        if self._loop is None or threading.current_thread() is not self._recover_thread:
            self._loop = _loop_binding()  # the loop that opens it (not auto_recover's own)
        link = _take_spare(self)
        if link is None:
            link = await anyio.to_thread.run_sync(_Link, self)
        link.bind_loop(self._loop)
        try:
            with anyio.CancelScope(shield=False):
                info = await link.ask("open", self.inner, str(device), self._pool_config)
        except BaseException:  # cancelled too: the close must run (it left a zombie, a thread)
            link.closing = True
            with contextlib.suppress(OSError):
                link.proc.kill()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(link.close, 5.0)
            raise
        self._link = link
        self._info = info
        object.__setattr__(self, "version", str(info.get("version", "")))
        return self._opened(link, device)

    def _opened(self, link: _Link, device: Device) -> Opened[IsoStream]:
        info = self._info
        caps: BackendCapabilities = info["capabilities"]
        limits = caps.limits
        total = limits.memory_bytes or (1 << 40)
        pool = _ProxyPool(link, device, total, self._pool_config)
        default = IsoStream(link, 0, device, f"{device}/isolated-default")
        langs = info.get("languages")
        return Opened(
            streams=[default],
            memory=_ProxyMemoryKernels(self, link, pool),
            tensor=_ProxyTensorKernels(self, link),  # type: ignore[abstract]  # set below it
            factory=_ProxyFactoryKernels(self, link),  # type: ignore[abstract]
            fused=_ProxyFusedKernels(self, link),
            executor=_ProxyExecutor(self, link, langs) if langs is not None else None,
            dtypes=frozenset(info["dtypes"]),
            capabilities=caps,
        )

    def _open_stream(self) -> IsoStream:
        link = self._link
        assert link is not None
        sid = next(self._sids)
        link.send(("s", sid))
        return IsoStream(link, sid, self.default_stream.device, f"{self._device}/isolated{sid}")

    async def _shutdown(self) -> None:
        recovering = self._recover_thread
        if recovering is not None and recovering is not threading.current_thread():
            # An automatic recovery under way ends first: it sees the shutdown and stops the
            # worker it started (or, done before, leaves its link to be stopped here).
            await anyio.to_thread.run_sync(recovering.join, 60.0)
        link = self._link
        try:
            if link is not None and link.fault is None:
                await super()._shutdown()
            elif self._pool is not None:
                self._pool.invalidate_all(close=True)
        finally:
            if link is not None:
                await self._stop(link)

    async def _stop(self, link: _Link) -> None:
        if link.fault is not None and not link.lost_reported:
            await anyio.to_thread.run_sync(link.settle_loss)
        keep = _spares_wanted() and link.fault is None
        if link.fault is None:
            try:
                with anyio.fail_after(30):
                    self.worker_used_at_shutdown = await link.ask("shutdown", keep)
            except BaseException:
                keep = False
        if self._link is link:
            self._link = None
        if keep and _put_spare(self.inner, link):
            return
        link.closing = True
        await anyio.to_thread.run_sync(link.close, 10.0)

    # -- faults -----------------------------------------------------------------------------------
    def _on_fault(self, fault: WorkerLostError) -> None:
        """Called by the link's threads when the worker is lost."""
        self.last_fault = fault
        faults.record(
            faults.FaultRecord(
                time=faults.now(), pid=os.getpid(), backend=str(self.name),
                device=str(self._device), generation=self.generation,
                cause=fault.cause, message=str(fault).split("\n", 1)[0],
            )
        )  # fmt: skip
        if self._pool is not None:
            self._pool.invalidate_all(close=True)  # every handle from before is stale
        if self._state is _READY:
            self.mark_failed(str(fault).split("\n", 1)[0])
        if self.auto_recover and not self._closing and not self._recovering:
            # Named before it starts: a shutdown from now on finds it, and waits for it.
            thread = threading.Thread(target=self._recover_blocking, daemon=True)
            self._recover_thread = thread
            thread.start()

    def _recover_blocking(self) -> None:
        try:
            with contextlib.suppress(Exception):
                anyio.run(self.recover)
        finally:
            self._recover_thread = None

    async def recover(self) -> None:
        """Start a new worker after a fault and reopen the device in it: every tensor, stream,
        event and kernel handle from before is stale (StaleHandleError), and the backend is
        ready again. Nothing to do while the worker is healthy. Rate-limited: at most
        ``max_restarts`` within ``restart_window`` seconds (DeviceError beyond). One recovery
        at a time: a second (the automatic one's thread, another task) waits for the first,
        then finds the worker healthy (two started a worker each, and one outlived shutdown)."""
        # The holder may run on another thread's event loop (no anyio primitive spans both);
        # a blocking acquire on a worker thread would take the lock after a cancellation.
        while not self._recover_lock.acquire(blocking=False):  # noqa: ASYNC110
            await anyio.sleep(0.01)
        try:
            await self._recover()
        finally:
            self._recover_lock.release()

    async def _recover(self) -> None:
        link = self._link
        if self._state is _READY and link is not None and link.fault is None:
            return
        if self._state in (LifecycleState.CREATED, LifecycleState.SHUT_DOWN):
            raise NotInitializedError(f"backend {self.name!r} is not open: nothing to recover")
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > self.restart_window:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            raise DeviceError(
                f"the isolated {self.name} worker was restarted {len(self._restarts)} times in"
                f" the last {self.restart_window:g} s; not again before"
                f" {self.restart_window - (now - self._restarts[0]):.0f} s (the last fault:"
                f" {self.last_fault})"
            )
        self._restarts.append(now)
        old_pool = self._pool
        if link is not None:
            self._recovering = True
            try:
                await self._stop(link)
            finally:
                self._recovering = False
        device = self._device
        assert device is not None
        try:
            opened = await self._initialize(device)
            # Shut down meanwhile (or shutting down): the new worker is stopped, not installed.
            state: LifecycleState = self.state  # (read again: shutdown may have run meanwhile)
            if self._closing or state is LifecycleState.SHUT_DOWN:
                if self._link is not None:
                    await self._stop(self._link)
                raise NotInitializedError(
                    f"backend {self.name!r} was shut down while its worker was restarted"
                )
            self._install(opened)
        except NotInitializedError:
            raise
        except BaseException as exc:
            self.mark_failed(f"restarting the isolated {self.name} worker failed: {exc!r}")
            raise
        if old_pool is not None:
            self.pool.generation = old_pool.generation + 1
        self._error = None
        self._state = _READY

    async def reopen(self) -> None:
        """As :meth:`recover` (a new worker) when the worker was lost; else the base's."""
        if self._link is not None and self._link.fault is not None:
            await self.recover()
            return
        await super().reopen()

    # -- introspection ----------------------------------------------------------------------------
    @property
    def worker_pid(self) -> int | None:
        """The worker process's pid (None while none runs)."""
        link = self._link
        return link.pid if link is not None and link.fault is None else None

    @property
    def restarts(self) -> int:
        """Restarts within the current rate-limit window."""
        return len(self._restarts)

    @property
    def status(self) -> BackendStatus:
        st = super().status
        if st.error is None and self.last_fault is not None:
            first = str(self.last_fault).split("\n", 1)[0]
            return st.model_copy(update={"error": f"recovered from: {first}"})
        return st

    async def worker_memory_info(self) -> MemoryInfo:
        """The real pool's statistics, counted in the worker."""
        self.check_ready()
        assert self._link is not None
        import gc

        gc.collect()
        info: MemoryInfo = await self._link.ask("info")
        return info

    def __repr__(self) -> str:
        return (
            f"<IsolatedBackend {self.name} {self._state.value} device={self._device}"
            f" worker={self.worker_pid}>"
        )
