"""One device, ``crash:0``, described without importing the backend module or NumPy.

``ACCELKIT_TESTPLUG_CRASH_PROBE`` makes the probe itself misbehave (read at each call):
``abort`` (print a driver-style fatal line and ``os.abort()``), ``hang`` (sleep for an hour),
``exit`` (``os._exit(3)``), ``exit0`` (``os._exit(0)``); anything else, or unset, lists the
device.
"""

from __future__ import annotations

import os
import sys
import time

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.plugins import KERNEL_OPS, TENSOR_OPS

_MEMORY = 256 << 20


def capabilities() -> BackendCapabilities:
    return BackendCapabilities(
        backend="crash",
        device="crash:0",
        dtypes=frozenset(DType),
        ops=TENSOR_OPS,
        fused_ops=KERNEL_OPS,
        features=Features(fp16=True, bf16=True, fp64=True),
        limits=Limits(memory_bytes=_MEMORY, max_alloc_bytes=_MEMORY, compute_units=1),
        performance=PerformanceHints(
            peak_gflops={DType.F32: 1.0, DType.F64: 0.5}, bandwidth_gbs=1.0, power_watts=1.0
        ),
    )


#: The fatal line the probe prints before aborting (tests look for it).
PROBE_FATAL_LINE = "fatal: the crash driver's probe aborts on purpose"


def probe() -> list[DeviceInfo]:
    mode = os.environ.get("ACCELKIT_TESTPLUG_CRASH_PROBE", "").strip().lower()
    if mode == "abort":
        sys.stderr.write(PROBE_FATAL_LINE + "\n")
        sys.stderr.flush()
        os.abort()
    if mode == "hang":
        time.sleep(3600)
    if mode == "exit":
        os._exit(3)
    if mode == "exit0":
        os._exit(0)
    return [
        DeviceInfo(
            device=Device("crash", 0),
            backend="crash",
            name="Crash device",
            vendor="accelkit tests",
            memory_bytes=_MEMORY,
            compute_units=1,
            capabilities=capabilities(),
        )
    ]
