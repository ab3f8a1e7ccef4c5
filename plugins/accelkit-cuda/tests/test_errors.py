"""CUDA errors become accelkit errors; the rebuild policy of a poisoned context (no GPU)."""

from __future__ import annotations

import pytest
from accelkit_cuda.errors import MAX_REBUILDS, STICKY_ERRORS, RebuildLimiter, error_code, translate

from accelkit.errors import ContextPoisonedError, DeviceError, OutOfMemoryError


class FakeCudaError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


@pytest.mark.parametrize("code", sorted(STICKY_ERRORS))
def test_sticky_errors_poison_the_context(code: int) -> None:
    err = translate(FakeCudaError(code), "reading a tensor")
    assert isinstance(err, ContextPoisonedError)
    assert "reading a tensor" in str(err)
    assert "recover()" in str(err)


def test_other_errors() -> None:
    assert isinstance(translate(FakeCudaError(2), "alloc"), OutOfMemoryError)
    err = translate(FakeCudaError(1), "a launch")
    assert type(err) is DeviceError
    assert "CUDA error 1" in str(err)
    assert error_code(Exception("cudaErrorIllegalAddress: 700 an illegal memory access")) == 700


def test_rebuilds_are_limited_per_window() -> None:
    now = [0.0]
    limiter = RebuildLimiter(clock=lambda: now[0])
    for t in range(MAX_REBUILDS):  # at 0, 10 and 20 s
        now[0] = 10.0 * t
        assert limiter.allow()
    now[0] = 59.0
    assert not limiter.allow()  # a 4th within 60 s: the device is marked failed
    now[0] = 60.5  # the rebuild at 0 s left the window; those at 10 and 20 s did not
    assert limiter.allow()
    assert not limiter.allow()
