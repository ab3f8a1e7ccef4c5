"""Whether the submission thread is capturing a CUDA graph now, and what must wait until it ends.

:func:`accelkit_cuda.graphs.capture_graph` runs a capture's closures on the submission thread
between ``begin_capture`` and ``end_capture`` inside :func:`capturing`. Meanwhile:

- GEMMs go to cuBLAS through :mod:`accelkit_cuda.blas` (ctypes), not ``cupy.matmul``: CuPy's
  cuBLAS wrappers call its ``cublas.setStream``, which raises ``NotImplementedError('calling
  cuBLAS API during stream capture is currently unsupported')`` on a capturing stream;
- a block of the backend's pool freed on that thread is freed after the capture
  (:func:`defer`): a ``cudaFree`` may synchronize the device, which would invalidate the capture.

Before that, :func:`accelkit_cuda.graphs.capture_graph` re-issues the recorded calls on the
loop's thread to collect their closures, inside :func:`collecting`: a launch whose check reads
a flag the device writes (``_launch_checked``) adds no check then, since the graph's copy of the
flag runs at each replay, not before the next await.

The state is per thread (a thread-local), so nothing on another thread sees it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["active", "capturing", "collecting", "defer", "is_collecting"]


class _State(threading.local):
    stream: int | None = None
    deferred: list[Callable[[], object]] | None = None
    collecting = False


_state = _State()


def active() -> int | None:
    """The pointer of the CUDA stream this thread is capturing, or None."""
    return _state.stream


@contextmanager
def capturing(stream: int) -> Iterator[None]:
    """Mark this thread as capturing on ``stream`` (a CUDA stream pointer); on exit, run what
    was deferred meanwhile (in order)."""
    _state.stream, _state.deferred = stream, []
    try:
        yield
    finally:
        deferred = _state.deferred
        _state.stream, _state.deferred = None, None
        for fn in deferred:
            fn()


@contextmanager
def collecting() -> Iterator[None]:
    """Mark this thread as re-issuing a capture's calls to collect their closures."""
    _state.collecting = True
    try:
        yield
    finally:
        _state.collecting = False


def is_collecting() -> bool:
    """Whether this thread is inside :func:`collecting`."""
    return _state.collecting


def defer(fn: Callable[[], object]) -> bool:
    """Queue ``fn`` to run when this thread's capture ends: True; False (not capturing: the
    caller runs it now)."""
    deferred = _state.deferred
    if deferred is None:
        return False
    deferred.append(fn)
    return True
