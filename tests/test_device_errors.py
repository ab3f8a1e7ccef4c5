"""``sdk.DeviceErrors``: the errors of failed device work, raised by the await that covers it,
once each."""

from __future__ import annotations

import threading

import pytest

from accelkit.errors import DeviceError, OutOfMemoryError
from accelkit.sdk import DeviceErrors


class Errors(DeviceErrors):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.checks = []


def test_each_error_is_raised_once_by_the_first_await_that_covers_it() -> None:
    errors = Errors()
    first, second = DeviceError("first"), DeviceError("second")
    errors.add_check(1, lambda: None)  # completed, found nothing
    errors.add_check(2, lambda: first)
    errors.add_check(3, lambda: second)
    errors.raise_errors(1)  # nothing at or before 1
    with pytest.raises(DeviceError, match="first"):
        errors.raise_errors(3)
    with pytest.raises(DeviceError, match="second"):  # a later await: the other failure
        errors.raise_errors(3)
    errors.raise_errors(3)  # both told


def test_one_failure_met_by_two_pieces_of_work_is_reported_once() -> None:
    """A failed allocation is met by the op that writes the block and by the read of its
    output: the same error object at two positions is dropped with the first; an equal but
    distinct error (another failure) stays for the next await, and so does one after the
    await's position."""
    errors = Errors()
    failed = OutOfMemoryError("a 16384-byte block could not be allocated")
    other = OutOfMemoryError("a 16384-byte block could not be allocated")
    errors.add_check(1, lambda: failed)
    errors.add_check(2, lambda: failed)
    errors.add_check(3, lambda: other)
    errors.add_check(5, lambda: failed)
    with pytest.raises(OutOfMemoryError) as raised:
        errors.raise_errors(4)
    assert raised.value is failed
    with pytest.raises(OutOfMemoryError) as raised:
        errors.raise_errors(4)
    assert raised.value is other
    errors.raise_errors(4)
    with pytest.raises(OutOfMemoryError) as raised:  # past the first await's position
        errors.raise_errors(5)
    assert raised.value is failed
