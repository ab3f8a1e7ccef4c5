"""CUDA errors as accelkit errors, and the policy for rebuilding a poisoned context.

A *sticky* CUDA error (an illegal address, a device-side assert, a kernel that trapped) leaves
the context unusable: every later call in the process fails with the same code. It becomes
:class:`~accelkit.errors.ContextPoisonedError`; the backend then rebuilds its context (see
``CUDABackend.recover``), bumps its generation so that tensors and kernels from before raise
:class:`~accelkit.errors.StaleHandleError`, and gives up (the device is marked failed) after
:data:`MAX_REBUILDS` rebuilds within :data:`REBUILD_WINDOW_S` seconds.

This module imports no CuPy: the error codes are matched by number.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable

from accelkit.errors import AccelError, ContextPoisonedError, DeviceError, OutOfMemoryError

__all__ = [
    "MAX_REBUILDS",
    "REBUILD_WINDOW_S",
    "STICKY_ERRORS",
    "RebuildLimiter",
    "error_code",
    "translate",
]

#: cudaError_t values after which the context is unusable.
STICKY_ERRORS = {
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
}
_OUT_OF_MEMORY = 2
MAX_REBUILDS = 3
REBUILD_WINDOW_S = 60.0


def error_code(exc: BaseException) -> int | None:
    """The CUDA error code of a CuPy ``CUDARuntimeError`` or ``CUDADriverError`` (its ``status``, or parsed from its text)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    match = re.search(r"\b(\d{1,4})\b", str(exc))
    return int(match.group(1)) if match else None


def translate(exc: BaseException, what: str) -> AccelError:
    """The accelkit error for a CUDA error raised while doing ``what``."""
    code = error_code(exc)
    if code in STICKY_ERRORS:
        return ContextPoisonedError(
            f"{what}: {STICKY_ERRORS[code]} ({code}): {exc}. The CUDA context is poisoned;"
            " await backend.recover() to rebuild it (tensors and kernels from before become stale)"
        )
    if code == _OUT_OF_MEMORY:
        return OutOfMemoryError(f"{what}: the device is out of memory ({exc})")
    return DeviceError(f"{what}: CUDA error {code}: {exc}")


class RebuildLimiter:
    """Allows at most ``limit`` rebuilds in any ``window`` seconds (``clock`` for tests)."""

    def __init__(
        self,
        limit: int = MAX_REBUILDS,
        window: float = REBUILD_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        """Record a rebuild if one is allowed now; False once the limit is reached."""
        with self._lock:
            now = self._clock()
            while self._times and now - self._times[0] >= self.window:
                self._times.popleft()
            if len(self._times) >= self.limit:
                return False
            self._times.append(now)
            return True

    def describe(self) -> str:
        return f"{self.limit} context rebuilds within {self.window:g} s"
