"""CUDA errors as accelkit errors.

A *sticky* CUDA error (an illegal address, a device-side assert, a kernel that trapped, an
uncorrectable ECC error, ...) leaves the process's CUDA context unusable: every later call fails
with the same code, and NVIDIA's documentation is plain that "to continue using CUDA, the process
must be terminated and relaunched" (resetting the primary context does not clear it). It
becomes :class:`~accelkit.errors.ContextPoisonedError`, and the backend is *poisoned*: every
later call raises it, naming the first fault (``CUDABackend._failed``). There is no in-process
recovery; run the backend in a process that can be restarted.

Errors are classified by their status code, never by their text: "an illegal memory access was
encountered" mentions memory, and is not an out-of-memory error.

This module imports no CuPy: the error codes are matched by number (the runtime's
``cudaError_t`` and the driver's ``CUresult`` agree on every code below).
"""

from __future__ import annotations

import re

from accelkit.errors import AccelError, ContextPoisonedError, DeviceError, OutOfMemoryError

__all__ = ["OUT_OF_MEMORY", "RESTART", "STICKY_ERRORS", "error_code", "translate"]

#: cudaError_t values after which the context is unusable (the CUDA runtime API's list of
#: errors that "leave the process in an inconsistent state"; ECC, NVLink and unknown errors
#: are treated the same, since nothing says the context survives them).
STICKY_ERRORS = {
    214: "cudaErrorECCUncorrectable",
    220: "cudaErrorNvlinkUncorrectable",
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
    911: "cudaErrorExternalDevice",
    999: "cudaErrorUnknown",
}
#: cudaErrorMemoryAllocation (the driver's CUDA_ERROR_OUT_OF_MEMORY has the same value).
OUT_OF_MEMORY = 2
#: What a poisoned backend tells its caller to do.
RESTART = (
    "this process can no longer use the GPU and must be restarted (a sticky CUDA error cannot"
    " be cleared inside the process that hit it)"
)

_BY_NAME = {name.lower(): code for code, name in STICKY_ERRORS.items()}
_DRIVER_NAMES = {
    "cuda_error_illegal_address": 700,
    "cuda_error_launch_timeout": 702,
    "cuda_error_assert": 710,
    "cuda_error_hardware_stack_error": 714,
    "cuda_error_illegal_instruction": 715,
    "cuda_error_misaligned_address": 716,
    "cuda_error_invalid_address_space": 717,
    "cuda_error_invalid_pc": 718,
    "cuda_error_launch_failed": 719,
    "cuda_error_ecc_uncorrectable": 214,
    "cuda_error_out_of_memory": OUT_OF_MEMORY,
    "cudaerrormemoryallocation": OUT_OF_MEMORY,
}


def error_code(exc: BaseException) -> int | None:
    """The CUDA error code of a CuPy ``CUDARuntimeError`` or ``CUDADriverError``: its
    ``status``, or else the error name its text starts with (``cudaErrorIllegalAddress: ...``,
    ``CUDA_ERROR_ILLEGAL_ADDRESS: ...``), or else a number after "error"; None if none."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    text = str(exc)
    name = re.match(r"\s*(\w+)", text)
    if name:
        key = name.group(1).lower()
        code = _BY_NAME.get(key, _DRIVER_NAMES.get(key))
        if code is not None:
            return code
    match = re.search(r"error\D{0,3}(\d{1,4})\b", text, re.IGNORECASE)
    return int(match.group(1)) if match else None


def translate(exc: BaseException, what: str) -> AccelError:
    """The accelkit error for a CUDA error raised while doing ``what``."""
    code = error_code(exc)
    if code in STICKY_ERRORS:
        return ContextPoisonedError(
            f"{what}: {STICKY_ERRORS[code]} ({code}): {exc}. The CUDA context is poisoned:"
            f" {RESTART}"
        )
    if code == OUT_OF_MEMORY:
        return OutOfMemoryError(f"{what}: the device is out of memory ({exc})")
    return DeviceError(f"{what}: CUDA error {code}: {exc}")
