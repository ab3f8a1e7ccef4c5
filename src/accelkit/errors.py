"""The accelkit error hierarchy.

Every error accelkit raises on purpose derives from :class:`AccelError`, so an application can catch
the whole family in one place. Messages name what was expected and what was given. An operation that
raises has changed nothing: no output was allocated, no memory is leaked, no device work is queued.
"""

from __future__ import annotations

import builtins
from typing import Any

__all__ = [
    "AccelError",
    "NotInitializedError",
    "UnsupportedOperationError",
    "InvalidArgumentError",
    "CaptureError",
    "OutOfMemoryError",
    "DeviceError",
    "ContextPoisonedError",
    "StaleHandleError",
    "WorkerLostError",
    "KernelCompileError",
    "BackendNotFoundError",
    "PluginLoadError",
    "IncompatiblePluginError",
    "TimeoutError",
]


class AccelError(Exception):
    """Base class of every error accelkit raises on purpose."""


class NotInitializedError(AccelError):
    """A backend was used before ``await backend.initialize(device)`` or after ``shutdown()``."""


class UnsupportedOperationError(AccelError):
    """The backend (or the device it runs on) cannot run this operation or dtype."""


class InvalidArgumentError(AccelError, ValueError):
    """An argument has the wrong shape, dtype, device, type or value.

    Also a :class:`ValueError`, so code written against NumPy conventions still catches it.
    """


class CaptureError(InvalidArgumentError):
    """What a graph capture refuses (``backend.capture()``): a host read or wait inside it,
    another stream, a nested capture, the replay of a capture that did not complete or on
    another stream. Also an :class:`InvalidArgumentError`."""


class OutOfMemoryError(AccelError, MemoryError):
    """An allocation would exceed the device's memory or the configured limit."""

    def __init__(self, message: str, *, requested: int = 0, used: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.requested = requested
        self.used = used
        self.limit = limit


class DeviceError(AccelError):
    """The device or its driver reported a failure."""


class ContextPoisonedError(DeviceError):
    """The device context hit a sticky error; it must be rebuilt before further use."""


class WorkerLostError(DeviceError):
    """The worker process of an isolated backend (``open_backend(..., isolate=True)``) died,
    hung past its deadline, or reported a sticky device error; ``cause`` says which (the
    signal's name, the fault's text, a hang) and ``stderr_tail`` holds the worker's last stderr
    lines. Every pending await of the backend raises it; ``await backend.recover()`` starts a
    new worker."""

    def __init__(self, message: str, *, cause: str = "", stderr_tail: str = "") -> None:
        super().__init__(message)
        self.cause = cause
        self.stderr_tail = stderr_tail

    def __reduce__(self) -> tuple[Any, ...]:
        return (_worker_lost, (str(self), self.cause, self.stderr_tail))


def _worker_lost(message: str, cause: str, stderr_tail: str) -> WorkerLostError:
    return WorkerLostError(message, cause=cause, stderr_tail=stderr_tail)


class StaleHandleError(AccelError):
    """A tensor, buffer or kernel handle outlived its allocation, its backend or its context."""


class KernelCompileError(AccelError):
    """A kernel failed to compile; ``log`` holds the compiler's output."""

    def __init__(self, message: str, *, log: str = "") -> None:
        super().__init__(f"{message}\n--- compiler log ---\n{log}" if log else message)
        self.log = log


class BackendNotFoundError(AccelError, LookupError):
    """No backend of that name is installed, or none can serve the requested device."""


class PluginLoadError(AccelError):
    """A plugin failed to import, probe or initialize; it is quarantined."""


class IncompatiblePluginError(PluginLoadError):
    """A plugin was built for another major version of the accelkit plugin API."""


class TimeoutError(AccelError, builtins.TimeoutError):
    """A wait on device work ran past its deadline."""
