"""Splitting one large host kernel between the cores.

NumPy releases the GIL inside its loops, so a kernel over independent rows (an elementwise op,
a norm, a filter over a batch of images) runs faster as slices on a few threads. The CPU backend's
stream worker calls :func:`split` for large work only: below :data:`MIN_ELEMENTS` the hand-off
costs more than it saves. The threads are accelkit's own (``accelkit-cpu-N``), started on first
use, as many as the machine has cores (at most 8); BLAS's threads are not involved (a stream runs
one kernel at a time, so a split kernel never overlaps a GEMM of the same stream).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
from collections.abc import Callable

__all__ = ["MIN_ELEMENTS", "split", "threads"]

#: Kernels over fewer elements than this run on the calling thread.
MIN_ELEMENTS = 1 << 17

_POOL: list[concurrent.futures.ThreadPoolExecutor] = []
_LOCK = threading.Lock()


def threads() -> int:
    """How many slices a large kernel is split into: the machine's cores, at most 8."""
    return max(1, min(os.cpu_count() or 1, 8))


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    if not _POOL:
        with _LOCK:
            if not _POOL:
                _POOL.append(
                    concurrent.futures.ThreadPoolExecutor(
                        threads(), thread_name_prefix="accelkit-cpu"
                    )
                )
    return _POOL[0]


def split(items: int, elements: int, run: Callable[[int, int], object]) -> None:
    """Call ``run(lo, hi)`` over slices of ``range(items)`` that cover it: on the calling thread
    when ``elements`` (the kernel's size) is small or there is one item, else on the pool, one
    slice per core. The first error of any slice is raised after every slice has finished."""
    parts = min(threads(), items) if elements >= MIN_ELEMENTS else 1
    if parts <= 1:
        run(0, items)
        return
    bounds = [items * i // parts for i in range(parts + 1)]
    jobs = [_pool().submit(run, lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
    concurrent.futures.wait(jobs)
    for job in jobs:
        job.result()
