"""CUDA errors become accelkit errors, by their status code (no GPU)."""

from __future__ import annotations

import pytest
from accelkit_cuda.errors import OUT_OF_MEMORY, STICKY_ERRORS, error_code, translate

from accelkit.errors import ContextPoisonedError, DeviceError, OutOfMemoryError


class FakeCudaError(Exception):
    def __init__(self, status: int, text: str = "") -> None:
        super().__init__(text or f"cudaError {status}")
        self.status = status


# The CUDA runtime's errors after which "the process must be terminated and relaunched".
DOCUMENTED_STICKY = {700, 702, 710, 714, 715, 716, 717, 718, 719}


def test_the_sticky_list_holds_the_documented_ones() -> None:
    assert set(STICKY_ERRORS) >= DOCUMENTED_STICKY
    assert {214, 999} <= set(STICKY_ERRORS)  # ECC uncorrectable, unknown
    assert OUT_OF_MEMORY not in STICKY_ERRORS
    assert 1 not in STICKY_ERRORS  # cudaErrorInvalidValue: the call failed, the context lives


@pytest.mark.parametrize("code", sorted(STICKY_ERRORS))
def test_sticky_errors_poison_the_context(code: int) -> None:
    err = translate(FakeCudaError(code), "reading a tensor")
    assert isinstance(err, ContextPoisonedError)
    assert "reading a tensor" in str(err)
    assert STICKY_ERRORS[code] in str(err)
    assert "must be restarted" in str(err)
    assert "recover" not in str(err)


def test_other_errors() -> None:
    assert isinstance(translate(FakeCudaError(2), "alloc"), OutOfMemoryError)
    err = translate(FakeCudaError(1), "a launch")
    assert type(err) is DeviceError
    assert "CUDA error 1" in str(err)


def test_an_illegal_memory_access_is_not_out_of_memory() -> None:
    text = "cudaErrorIllegalAddress: an illegal memory access was encountered"
    err = translate(FakeCudaError(700, text), "allocating 64 bytes")
    assert isinstance(err, ContextPoisonedError)
    assert not isinstance(err, OutOfMemoryError)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("cudaErrorIllegalAddress: an illegal memory access was encountered", 700),
        ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered", 700),
        ("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure", 719),
        ("cudaErrorMemoryAllocation: out of memory", 2),
        ("CUDA error 716 in a copy", 716),
        ("allocating 118.8 GiB would exceed 79.1 GiB", None),  # sizes are not codes
    ],
)
def test_error_codes_without_a_status(text: str, code: int | None) -> None:
    assert error_code(Exception(text)) == code
