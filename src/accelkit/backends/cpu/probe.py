"""The CPU backend's probe: the host CPU as device ``cpu:0``, without importing NumPy."""

from __future__ import annotations

import os
import platform

from accelkit._core.op_names import KERNEL_OPS, TENSOR_OPS
from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType

__all__ = ["cpu_capabilities", "probe", "system_memory_bytes"]


def system_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _cpu_name() -> tuple[str, str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            fields = dict(line.split(":", 1) for line in fh.read(16384).splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        return fields.get("model name", platform.machine()), fields.get("vendor_id", "")
    except OSError:
        return platform.processor() or platform.machine(), ""


def cpu_capabilities() -> BackendCapabilities:
    cores = os.cpu_count() or 1
    memory = system_memory_bytes()
    return BackendCapabilities(
        backend="cpu",
        device="cpu:0",
        dtypes=frozenset(DType),
        ops=TENSOR_OPS,
        fused_ops=KERNEL_OPS,
        features=Features(fp16=True, bf16=True, fp64=True, unified_memory=True),
        limits=Limits(memory_bytes=memory, max_alloc_bytes=memory, compute_units=cores),
        performance=PerformanceHints(
            # Declared estimates (16 f32 FMA lanes per core at ~2.5 GHz, half of it reached);
            # `accelkit calibrate` replaces them with measured figures.
            peak_gflops={DType.F32: 40.0 * cores, DType.F64: 20.0 * cores, DType.F16: 5.0 * cores},
            bandwidth_gbs=10.0,
            launch_latency_us=3.0,
            power_watts=15.0 * cores,
        ),
        extra={"machine": platform.machine()},
    )


def probe() -> list[DeviceInfo]:
    name, vendor = _cpu_name()
    caps = cpu_capabilities()
    return [
        DeviceInfo(
            device=Device("cpu", 0),
            backend="cpu",
            name=name,
            vendor=vendor,
            memory_bytes=caps.limits.memory_bytes,
            compute_units=caps.limits.compute_units,
            capabilities=caps,
        )
    ]
