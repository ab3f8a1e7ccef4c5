"""An option: the local cluster's workers run below the process that started them.

A local cluster sized to the machine gives every core a worker process. An application that
computes on the host too then shares the cores with the workers, and the operating system wakes
its threads late while they compute. ``ACCELKIT_DASK_WORKER_NICE=N`` (1 to 19) starts the
workers at nice ``N``: when the cores are otherwise idle they run at full speed, and when the
application wants a core, it gets it first. It is off (0) by default: on the 2-core machine of
``benchmarks/bench_dask.py``, whose application waits rather than computes, nice 10 did not
lower the event loop's lateness and cost the transformer block about a fifth of its throughput
(the scheduler's work comes before the workers'). Only a cluster the backend starts and owns is
touched; an external cluster's workers are left as their owner set them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from accelkit.errors import InvalidArgumentError
from accelkit.sdk import env_str

#: The nice value of a local cluster's worker processes (0: as this process's).
WORKER_NICE = 0


def worker_nice() -> int:
    """``ACCELKIT_DASK_WORKER_NICE`` (0 to 19), else :data:`WORKER_NICE`."""
    value = env_str("ACCELKIT_DASK_WORKER_NICE")
    if value is None:
        return WORKER_NICE
    try:
        nice = int(value)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise InvalidArgumentError(
            f"ACCELKIT_DASK_WORKER_NICE must be a nice value from 0 to 19; got {value!r}"
        )
    return nice


def lower_priority(nice: int) -> list[int]:
    """Run this process at nice ``nice`` at least (never raising a priority); returns the
    nice values it has now, one per thread. Linux keeps a nice value per thread, and a thread
    starts with its creator's: every thread there now is lowered, and the threads it starts
    later inherit the value."""
    if not hasattr(os, "setpriority"):  # Windows: no nice values
        return []
    if sys.platform != "linux":
        if os.getpriority(os.PRIO_PROCESS, 0) < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        return [os.getpriority(os.PRIO_PROCESS, 0)]
    now = []
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        with contextlib.suppress(OSError):  # a thread that has just ended
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            now.append(os.getpriority(os.PRIO_PROCESS, tid))
    return now


class Background(WorkerPlugin):  # type: ignore[misc]  # distributed is untyped: WorkerPlugin is Any
    """Lowers each worker's priority when it starts (a worker the nanny restarts too)."""

    name = "accelkit-background"

    def __init__(self, nice: int) -> None:
        self.nice = nice

    def setup(self, worker: Any) -> None:
        lower_priority(self.nice)
