"""``sdk.DeviceErrors``: errors of failed work, raised once by the awaits that cover them."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from accelkit.sdk import DeviceErrors


class Stream(DeviceErrors):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.checks = []


def _failing(error: BaseException) -> Callable[[], BaseException | None]:
    return lambda: error


def test_an_await_raises_every_failure_it_covers_once_and_later_ones_stay() -> None:
    """The first failure at or before the awaited position is raised, with the others it
    covers as notes (the second was left for the next await, of later work that had not
    failed); a failure after the position stays for the await that covers it."""
    s = Stream()
    first, second, third = ValueError("first"), ValueError("second"), ValueError("third")
    s.add_check(2, _failing(first))
    s.add_check(3, lambda: None)  # work that found nothing
    s.add_check(5, _failing(second))
    s.add_check(12, _failing(third))
    s.raise_errors(1)  # nothing at or before 1
    with pytest.raises(ValueError, match="first") as info:
        s.raise_errors(9)
    assert info.value.__notes__ == ["also failed before this await: ValueError: second"]
    s.raise_errors(9)  # each raised once (the clean check went on the way)
    assert [seq for seq, _ in s.checks] == [12]
    with pytest.raises(ValueError, match="third"):
        s.raise_errors(12)
    assert s.checks == []


class Shared(Stream):
    """Checks that report one failure several times (as CUDA's uses of a failed block): the
    hook drops, with the raised one, those of the same failure at or before the awaited
    position."""

    def __init__(self) -> None:
        super().__init__()
        self.failure_of: dict[int, str] = {}  # id(error) -> the failure it reports
        self.held: list[bool] = []

    def covered_checks_locked(
        self,
        error: BaseException,
        seq: int,
        checks: list[tuple[int, Callable[[], BaseException | None]]],
    ) -> list[tuple[int, Callable[[], BaseException | None]]]:
        self.held.append(self._lock.locked())
        failure = self.failure_of.get(id(error))
        return [
            (s, c)
            for s, c in checks
            if s > seq or failure is None or self.failure_of.get(id(c())) != failure
        ]


def test_the_hook_drops_what_the_raised_error_covers_under_the_lock() -> None:
    s = Shared()
    uses = [MemoryError(f"use {i}") for i in range(3)]
    other = ValueError("other")
    for seq, error in zip((1, 2, 6), uses, strict=True):
        s.failure_of[id(error)] = "block A"
        s.add_check(seq, _failing(error))
    s.add_check(3, _failing(other))
    with pytest.raises(MemoryError, match="use 0") as info:
        s.raise_errors(4)  # covers the uses at 1 and 2 and `other` (a note); the use at 6 stays
    assert s.held == [True]  # the hook ran in the hold of the lock the error was taken under
    assert info.value.__notes__ == ["also failed before this await: ValueError: other"]
    s.raise_errors(4)  # nothing more at or before 4
    with pytest.raises(MemoryError, match="use 2"):
        s.raise_errors(6)  # after the awaited position: its own report
    s.raise_errors(9)


class Claimed(Stream):
    """Streams sharing one failure (as CUDA's uses of a failed block on two streams): the
    first await to take it, on either stream, claims it under a lock they share; the other
    gets a replacement error."""

    def __init__(self, claimed: set[str], shared: threading.Lock) -> None:
        super().__init__()
        self.claimed, self.shared = claimed, shared
        self.held: list[bool] = []

    def claim_error_locked(self, error: BaseException) -> BaseException:
        self.held.append(self._lock.locked())
        with self.shared:
            if str(error) in self.claimed:
                return LookupError(f"{error}: raised by another stream's await")
            self.claimed.add(str(error))
        return error


def test_the_claim_hook_replaces_an_error_another_stream_raised() -> None:
    claimed: set[str] = set()
    shared = threading.Lock()
    a, b = Claimed(claimed, shared), Claimed(claimed, shared)
    a.add_check(1, _failing(MemoryError("block A")))
    b.add_check(1, _failing(MemoryError("block A")))
    with pytest.raises(MemoryError, match="block A"):
        b.raise_errors(1)
    with pytest.raises(LookupError, match="another stream"):
        a.raise_errors(1)
    assert a.held == b.held == [True]  # in the hold of the lock the error was taken under
    a.raise_errors(1)
    b.raise_errors(1)  # each stream's check went with its one report


def test_the_default_claim_is_the_error_itself() -> None:
    s = Stream()
    error = ValueError("mine")
    assert s.claim_error_locked(error) is error


def test_a_failure_named_in_a_note_is_raised_by_an_earlier_await_and_dropped_by_a_later_one() -> (
    None
):
    """Task A's await of later work (position 9) covers task B's failure at 5: it raises A's
    failure at 2 and names B's in a note. B's own await (position 6) still raises B's failure
    (it returned B's garbage without raising), and an await after 9 raises nothing stale."""
    s = Stream()
    a_err, b_err = ValueError("A failed"), KeyError("B failed")
    s.add_check(2, _failing(a_err))
    s.add_check(5, _failing(b_err))
    with pytest.raises(ValueError, match="A failed") as info:
        s.raise_errors(9)
    assert info.value.__notes__ == ["also failed before this await: KeyError: 'B failed'"]
    with pytest.raises(KeyError, match="B failed"):
        s.raise_errors(6)
    s.raise_errors(6)
    s.raise_errors(12)
    assert s.checks == []
    # Named at 9 and not taken by an earlier await: an await at or after 9 drops it.
    s.add_check(20, _failing(a_err))
    s.add_check(21, _failing(b_err))
    with pytest.raises(ValueError, match="A failed"):
        s.raise_errors(25)
    s.raise_errors(25)
    assert s.checks == []
