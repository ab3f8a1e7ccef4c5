"""One device, ``subset:0``, whose capabilities omit attention."""

from __future__ import annotations

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.plugins import KERNEL_OPS, TENSOR_OPS

#: The operations this backend refuses (TensorOps and KernelOps names).
MISSING_OPS = frozenset({"attention", "paged_attention", "adam_update"})

_MEMORY = 256 << 20


def capabilities() -> BackendCapabilities:
    return BackendCapabilities(
        backend="subset",
        device="subset:0",
        dtypes=frozenset(DType),
        ops=TENSOR_OPS - MISSING_OPS,
        fused_ops=KERNEL_OPS - MISSING_OPS,
        features=Features(fp16=True, bf16=True, fp64=True),
        limits=Limits(memory_bytes=_MEMORY, max_alloc_bytes=_MEMORY, compute_units=1),
        performance=PerformanceHints(
            peak_gflops={DType.F32: 1.0, DType.F64: 0.5}, bandwidth_gbs=1.0, power_watts=1.0
        ),
    )


def probe() -> list[DeviceInfo]:
    return [
        DeviceInfo(
            device=Device("subset", 0),
            backend="subset",
            name="Subset device",
            vendor="accelkit tests",
            memory_bytes=_MEMORY,
            compute_units=1,
            capabilities=capabilities(),
        )
    ]
