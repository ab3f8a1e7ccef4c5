"""One device, ``crash:0``, described without importing the backend module or NumPy."""

from __future__ import annotations

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


def probe() -> list[DeviceInfo]:
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
