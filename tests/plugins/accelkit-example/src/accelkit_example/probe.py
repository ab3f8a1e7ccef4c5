"""The cheap probe: which devices are here, without creating a context or importing a driver."""

from __future__ import annotations

import importlib.util

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import DeviceError
from accelkit.plugins import TENSOR_OPS

#: The device's memory: what the pool may hand out.
MEMORY = 2 << 30
#: What the device computes in. No half precision: the conformance suite skips F16/BF16 tests.
DTYPES = frozenset(DType) - {DType.F16, DType.BF16}


def capabilities() -> BackendCapabilities:
    return BackendCapabilities(
        backend="example",
        device="example:0",
        dtypes=DTYPES,  # what the backend really runs, no more
        ops=TENSOR_OPS,  # every TensorOps op
        fused_ops=frozenset(),  # no fused kernel: KernelOps runs the core's compositions
        features=Features(fp64=True, unified_memory=True),
        limits=Limits(memory_bytes=MEMORY, max_alloc_bytes=MEMORY, compute_units=1),
        performance=PerformanceHints(
            # Declared estimates, low on purpose: `accelkit calibrate` measures the real figures.
            peak_gflops={DType.F32: 1.0, DType.F64: 0.5},
            bandwidth_gbs=1.0,
            launch_latency_us=20.0,
            power_watts=10.0,
        ),
    )


def probe() -> list[DeviceInfo]:
    # Is the "driver" installed? find_spec answers without importing it.
    if importlib.util.find_spec("numpy") is None:
        raise DeviceError("NumPy is not installed: pip install numpy")
    return [
        DeviceInfo(
            device=Device("example", 0),
            backend="example",
            name="Example device",
            vendor="accelkit",
            memory_bytes=MEMORY,
            compute_units=1,
            capabilities=capabilities(),
        )
    ]
