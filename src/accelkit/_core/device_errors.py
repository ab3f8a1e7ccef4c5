"""Errors found on the device, reported when the work that found them is awaited.

A kernel that can meet bad input only on the device (an index out of range) sets an error flag
that is copied back to host memory in the same stream; the stream registers a *check* for that
position, and whoever next awaits that position (or a later one) gets the error, once. Streams of
device backends mix in :class:`DeviceErrors`; they hold ``_lock`` for their other state too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["DeviceErrors", "drop_tracebacks", "note_others", "pick_errors"]

Check = Callable[[], BaseException | None]


def pick_errors(
    entries: list[tuple[int, BaseException, int | None]], seq: int
) -> tuple[BaseException | None, list[BaseException], list[tuple[int, BaseException, int | None]]]:
    """For an await of position ``seq``: the error to raise, the others it names in notes, and
    the entries that stay. ``entries`` are ``(position, error, noted_at)``, oldest first;
    ``noted_at`` is the position of the await that named the error in a note (None: not yet).

    The first error at or before ``seq`` is raised, and gone. The others at or before ``seq``
    are named in its notes and stay, marked, for an await of an *earlier* position than this
    one (another task's own await, which covers them too: it raises one of them, so no failure
    is lost to a task that awaited later work first); an await at or after the one that named
    them drops them (a failed composition's second error was raised by the next await of
    unrelated, valid work)."""
    live = [e for e in entries if not (e[0] <= seq and e[2] is not None and e[2] <= seq)]
    covered = [e for e in live if e[0] <= seq]
    if not covered:
        return None, [], live
    first = covered[0]
    others = [e[1] for e in covered[1:] if e[1] is not first[1]]
    keep = [
        (e[0], e[1], seq if e[2] is None else min(e[2], seq)) if e[0] <= seq else e
        for e in live
        if e is not first
    ]
    for e in keep:  # kept for a later await: no frames (they hold the failed kernels' tensors)
        if e[0] <= seq and e[1] is not first[1]:
            drop_tracebacks(e[1])
    return first[1], others, keep


def drop_tracebacks(exc: BaseException | None) -> None:
    """Drop the tracebacks of ``exc`` and its causes: a kept error holds no frames (a failed
    kernel's frames hold its tensors, and so their memory)."""
    seen = 0
    while exc is not None and seen < 16:
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
        seen += 1


def note_others(error: BaseException, others: list[BaseException]) -> None:
    """Add to ``error``, the one an await raises, a note naming each other failure the same
    await covers (two kernels of one composition that both met a bad index): each failure is
    reported by the await that covers it, once (a second one was raised by the next await of
    unrelated, valid work)."""
    for other in others:
        error.add_note(f"also failed before this await: {type(other).__name__}: {other}")


class _Noted:
    """A check whose failure an await named in a note (it raised another): ``error``, and
    ``at``, the position of that await (:func:`pick_errors`' rule)."""

    __slots__ = ("at", "error")

    def __init__(self, error: BaseException, at: int) -> None:
        self.error = error
        self.at = at

    def __call__(self) -> BaseException:
        return self.error


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
        """Raise the first error of a check at or before ``seq`` (its work has completed), once,
        with the other failures this await covers as notes; they stay for an await of an
        earlier position, and go with one at or after this one (:func:`pick_errors`' rule).
        Errors after ``seq`` stay."""
        # Taken in a frame of its own: the traceback holds this frame, and a check that returns
        # an error it keeps would make a cycle through the loop's locals here.
        error = self._take_error(seq)
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle through the traceback keeping the work's objects alive

    def _take_error(self, seq: int) -> BaseException | None:
        # The rule of pick_errors, over checks: a failure named in a note is kept as a _Noted
        # check (its error, and the position of the await that named it).
        with self._lock:
            if not self.checks:
                return None
            checks = [
                e for e in self.checks
                if not (e[0] <= seq and type(e[1]) is _Noted and e[1].at <= seq)
            ]  # fmt: skip
            error: BaseException | None = None
            rest: list[tuple[int, Check]] = []
            for i, (at, check) in enumerate(checks):
                if at > seq:
                    continue
                if type(check) is _Noted:
                    error = check.error
                elif (found := check()) is not None:
                    error = self.claim_error_locked(found)
                if error is not None:
                    rest = checks[i + 1 :]
                    break
            if error is None:  # the clean checks at or before seq go
                self.checks = [entry for entry in checks if entry[0] > seq]
                return None
            keep: list[tuple[int, Check]] = []
            others: list[BaseException] = []
            for at, check in self.covered_checks_locked(error, seq, rest):
                if at > seq:
                    keep.append((at, check))
                    continue
                if type(check) is _Noted:
                    named = check.error
                    keep.append((at, _Noted(named, min(check.at, seq))))
                elif (found := check()) is not None:
                    named = self.claim_error_locked(found)
                    if named is not error:
                        drop_tracebacks(named)  # kept: no frames (they hold tensors)
                    keep.append((at, _Noted(named, seq)))
                else:
                    continue
                if named is not error:
                    others.append(named)
            note_others(error, others)
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
