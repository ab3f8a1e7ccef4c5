"""Errors found on the device, reported when the work that found them is awaited.

A kernel that can meet bad input only on the device (an index out of range) sets an error flag
that is copied back to host memory in the same stream; the stream registers a *check* for that
position, and whoever next awaits that position (or a later one) gets the error, once. Streams of
device backends mix in :class:`DeviceErrors`; they hold ``_lock`` for their other state too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["DeviceErrors", "note_others"]

Check = Callable[[], BaseException | None]


def note_others(error: BaseException, others: list[BaseException]) -> None:
    """Add to ``error``, the one an await raises, a note naming each other failure the same
    await covers (two kernels of one composition that both met a bad index): each failure is
    reported by the await that covers it, once (a second one was raised by the next await of
    unrelated, valid work)."""
    for other in others:
        error.add_note(f"also failed before this await: {type(other).__name__}: {other}")


class DeviceErrors:
    """Checks per stream position (see the module docstring)."""

    _lock: threading.Lock
    #: The pending checks, oldest first (guarded by the stream's ``_lock``).
    checks: list[tuple[int, Check]]

    def add_check(self, seq: int, check: Check) -> None:
        """Report ``check()``'s error (if any) when position ``seq`` or a later one is awaited.

        ``check`` only reads host memory the device wrote in the same stream."""
        with self._lock:
            self.checks.append((seq, check))

    def raise_errors(self, seq: int) -> None:
        """Raise the first error of a check at or before ``seq`` (its work has completed), once;
        the other failures this await covers go with it as notes (:func:`note_others`), not to
        the next await of some later, unrelated work. Errors after ``seq`` stay."""
        # Taken in a frame of its own: the traceback holds this frame, and a check that returns
        # an error it keeps would make a cycle through the loop's locals here.
        error = self._take_error(seq)
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle through the traceback keeping the work's objects alive

    def _take_error(self, seq: int) -> BaseException | None:
        with self._lock:
            if not self.checks:
                return None
            error: BaseException | None = None
            rest: list[tuple[int, Check]] = []
            for i, entry in enumerate(self.checks):
                if entry[0] <= seq and (found := entry[1]()) is not None:
                    error = self.claim_error_locked(found)
                    rest = self.checks[i + 1 :]
                    break
            if error is None:  # the clean checks at or before seq go
                self.checks = [entry for entry in self.checks if entry[0] > seq]
                return None
            keep, others = [], []
            for entry in self.covered_checks_locked(error, seq, rest):
                if entry[0] > seq:
                    keep.append(entry)
                elif (found := entry[1]()) is not None:
                    others.append(self.claim_error_locked(found))
            note_others(error, [e for e in others if e is not error])
            self.checks = keep
        return error

    def claim_error_locked(self, error: BaseException) -> BaseException:
        """Hook, ``_lock`` held, as ``error`` is taken to be raised by an await: the error to
        raise in its place. A failure that checks of several streams can report (CUDA: a block
        whose ``cudaMalloc`` failed, used on two streams) is claimed here, under a lock those
        streams share, by the first await to take it; another stream's await, even one taking
        it at the same moment under its own lock, gets the error this returns for it instead.
        The default returns ``error``: each error is its own."""
        return error

    def covered_checks_locked(
        self, error: BaseException, seq: int, checks: list[tuple[int, Check]]
    ) -> list[tuple[int, Check]]:
        """Hook, ``_lock`` held, as ``error`` is taken to be raised by an await of ``seq``:
        which of the other ``checks`` to keep. A stream whose checks can report one failure
        several times (CUDA: every use of a block whose ``cudaMalloc`` failed) drops those the
        raised error covers here, in the same hold of the lock as the take, so that no other
        await (another thread's, a completer's prune) sees the failure between the two. The
        default keeps them all: each error is its own."""
        return checks

    def discard_errors(self) -> None:
        """Forget unreported errors (at shutdown)."""
        with self._lock:
            self.checks = []

    def prune_checks_locked(self, completed: int) -> None:
        """Drop the checks of completed work that found nothing (``_lock`` held)."""
        if self.checks:
            self.checks = [(s, c) for s, c in self.checks if s > completed or c() is not None]
