"""What both sides of an isolated backend share: shared-memory segments for large transfers,
how errors cross the pipe, and the thresholds.

A segment is a file under ``/dev/shm`` (the platform's temporary folder elsewhere), created and
unlinked by the user's process, mapped by both; Python's ``multiprocessing.shared_memory`` is
not used, because its resource tracker would count a segment mapped by two processes twice.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import tempfile
from typing import Any

import numpy as np

import accelkit.errors as errors_module
from accelkit.errors import AccelError, DeviceError

__all__ = ["SHM_THRESHOLD", "Segment", "decode_error", "encode_error", "map_segment"]

#: Transfers of at least this many bytes go through a shared-memory segment; smaller ones are
#: pickled through the pipe.
SHM_THRESHOLD = 1 << 18

_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_counter = itertools.count()


class Segment:
    """A shared-memory segment of ``nbytes`` (at least 1), created by the user's process."""

    __slots__ = ("map", "nbytes", "path")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.path = os.path.join(_SHM_DIR, f"accelkit-iso-{os.getpid()}-{next(_counter)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(1, nbytes))
            self.map = mmap.mmap(fd, max(1, nbytes))
        finally:
            os.close(fd)

    def array(self) -> np.ndarray[Any, Any]:
        """The segment's bytes as a flat uint8 array (the mapping lives as long as it)."""
        return np.frombuffer(self.map, np.uint8, self.nbytes)

    def unlink(self) -> None:
        """Remove the segment's name (mappings stay valid until dropped)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def map_segment(path: str, nbytes: int) -> np.ndarray[Any, Any]:
    """The worker's view of a segment the user's process created."""
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, max(1, nbytes))
    finally:
        os.close(fd)
    return np.frombuffer(m, np.uint8, nbytes)


def encode_error(exc: BaseException) -> tuple[str, str]:
    """An exception as (class name, message): safe to pickle whatever its constructor."""
    return type(exc).__name__, str(exc)


def decode_error(encoded: tuple[str, str], where: str) -> AccelError:
    """The error the worker raised, as the same accelkit class where there is one, else a
    DeviceError naming the worker's class."""
    name, message = encoded
    cls = getattr(errors_module, name, None)
    if isinstance(cls, type) and issubclass(cls, AccelError):
        try:
            return cls(message)
        except TypeError:
            pass
    return DeviceError(f"an operation on {where} failed: {name}: {message}")
