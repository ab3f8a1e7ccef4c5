"""Stream positions: the numbering every accelkit stream keeps, and what readers wait on.

Work submitted to a stream is numbered in submission order: the n-th submission is *position*
n (the first is 1; position 0 means "nothing": a tensor not yet written). A stream counts
``submitted`` (the last position handed out) and ``completed`` (every position up to it has
finished, in order). A kernel records its outputs as written at its position
(:func:`accelkit.sdk.mark_written`); a reader of a tensor waits for the position of its last
writer (:func:`accelkit.sdk.last_writer`, :func:`accelkit.sdk.pending_writes`), on the stream
that wrote it, and another stream orders itself after it on the device.

:class:`PositionStream` declares that protocol; :class:`Waiters` is the heap of callbacks a
stream runs when a position completes, which every stream implementation needs.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from accelkit._core.loop import wait_for_callback
from accelkit.abc.stream import Event, Stream

__all__ = ["PositionEvent", "PositionStream", "Waiters"]

_ids = itertools.count()


class Waiters:
    """Callbacks waiting for stream positions, kept under the stream's own lock.

    A stream calls :meth:`add` when someone waits for a position and :meth:`due` (holding
    ``lock``) each time its ``completed`` count moves; it runs the callbacks ``due`` returned
    after releasing the lock.
    """

    __slots__ = ("_heap", "_lock")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._heap: list[tuple[int, int, Callable[[], None]]] = []

    def add(
        self, seq: int, callback: Callable[[], None], completed: Callable[[], int]
    ) -> Callable[[], None] | None:
        """Call ``callback`` (from any thread) once ``completed() >= seq``: now, on this thread,
        if it already is (returning None), else later, returning a function that unregisters
        it. ``completed`` is read under the lock."""
        entry = (seq, next(_ids), callback)
        with self._lock:
            if completed() < seq:
                heapq.heappush(self._heap, entry)

                def unregister() -> None:
                    with self._lock:
                        if entry in self._heap:
                            # A new heap swapped in whole: :meth:`first` reads without the
                            # lock, and a list mid-heapify may have the wrong first entry.
                            heap = [e for e in self._heap if e is not entry]
                            heapq.heapify(heap)
                            self._heap = heap

                return unregister
        callback()
        return None

    def due(self, completed: int) -> list[Callable[[], None]]:
        """The callbacks waiting for positions up to ``completed``, removed (call with the
        lock held; run them after releasing it)."""
        heap = self._heap
        ready: list[Callable[[], None]] = []
        while heap and heap[0][0] <= completed:
            ready.append(heapq.heappop(heap)[2])
        return ready

    def first(self) -> int | None:
        """The lowest position waited for, or None: read without the lock, so a hint (a
        stream's completer deciding whether a round is worth polling for)."""
        try:
            return self._heap[0][0]
        except IndexError:
            return None

    def __len__(self) -> int:
        return len(self._heap)


class PositionStream(Stream):
    """A stream that numbers its work (see the module docstring): what the backend base classes,
    the memory managers and :func:`accelkit.sdk.mark_written` rely on.

    A subclass provides ``submitted`` and ``completed``, :meth:`add_waiter` (usually with
    :class:`Waiters`), :meth:`wait_for_blocking`, and how errors of failed work are told
    (:meth:`raise_errors`, :meth:`discard_errors`); the awaits, ``query`` and ``synchronize``
    follow from those.
    """

    if TYPE_CHECKING:
        # Read-only here; a stream may keep them as plain attributes (HostStream) or compute
        # them (a device stream's completed count), so they are no descriptors at run time.
        @property
        def submitted(self) -> int:
            """The last position handed out (0 before the first submission)."""

        @property
        def completed(self) -> int:
            """Every position up to this one has finished (successfully or not)."""

    @abstractmethod
    def add_waiter(self, seq: int, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (from any thread) once position ``seq`` has completed; returns a
        function that unregisters it, or None when it was called at once."""

    @abstractmethod
    def wait_for_blocking(self, seq: int) -> None:
        """Block this thread until position ``seq`` has completed; raise like
        :meth:`wait_for` (for threads and scripts, never the event loop's thread)."""

    @abstractmethod
    def raise_errors(self, seq: int) -> None:
        """Raise (once) the error of failed work at or before position ``seq``, if any."""

    def discard_errors(self) -> None:
        """Forget errors not yet raised (at shutdown: nobody is left to tell)."""

    async def wait_for(self, seq: int) -> None:
        """Wait, without blocking the event loop, until position ``seq`` has completed; raise
        the error of failed work at or before it."""
        if self.completed < seq:
            await wait_for_callback(lambda cb: self.add_waiter(seq, cb))
        self.raise_errors(seq)

    async def wait_for_quietly(self, seq: int) -> None:
        """Wait like :meth:`wait_for`, without raising (shutdown): the errors stay for the
        awaits of their positions (another task's, of work it submitted while shutdown drained,
        must still raise its own)."""
        if self.completed < seq:
            await wait_for_callback(lambda cb: self.add_waiter(seq, cb))

    def query(self) -> bool:
        return self.completed >= self.submitted

    async def synchronize(self) -> None:
        await self.wait_for(self.submitted)

    def synchronize_blocking(self) -> None:
        """Blocking twin of :meth:`synchronize`."""
        self.wait_for_blocking(self.submitted)

    def prune(self) -> None:
        """Release what completed work kept alive (called before allocations and statistics);
        nothing by default."""

    def close(self) -> None:
        """Let queued work finish, then release the stream (called by shutdown, off the event
        loop); nothing by default."""


PS = TypeVar("PS", bound=PositionStream)


class PositionEvent(Event, Generic[PS]):
    """An event at a position ``seq`` of a :class:`PositionStream`: it has completed once the
    stream's ``completed`` reaches it (what ``record_event`` of such a stream returns; a subclass
    adds what its device keeps, e.g. a driver event)."""

    __slots__ = ("_stream", "seq")

    def __init__(self, stream: PS, seq: int) -> None:
        self._stream = stream
        self.seq = seq

    @property
    def stream(self) -> PS:
        return self._stream

    def query(self) -> bool:
        return self._stream.completed >= self.seq

    async def wait(self) -> None:
        await self._stream.wait_for(self.seq)

    def wait_blocking(self) -> None:
        self._stream.wait_for_blocking(self.seq)
