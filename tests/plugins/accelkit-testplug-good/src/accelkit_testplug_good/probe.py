"""The cheap probe: two fake devices, described without importing the backend module or NumPy."""

from __future__ import annotations

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.plugins import KERNEL_OPS, TENSOR_OPS

#: How many times :func:`probe` ran in this process (tests check that probes are cached).
CALLS = 0

_MIB = 1 << 20

#: index -> (name, declared F32 GFLOP/s, memory bytes, board watts). The slow device has more
#: memory and better GFLOP/s per watt, so each policy picks a different device.
DEVICES: dict[int, tuple[str, float, int, float]] = {
    0: ("FakeGPU Slow 100", 2.0, 512 * _MIB, 1.0),
    1: ("FakeGPU Fast 900", 4.0, 256 * _MIB, 4.0),
}


def capabilities(index: int) -> BackendCapabilities:
    _name, gflops, memory, watts = DEVICES[index]
    return BackendCapabilities(
        backend="fakegpu",
        device=f"fakegpu:{index}",
        dtypes=frozenset(DType),
        ops=TENSOR_OPS,
        fused_ops=KERNEL_OPS,
        features=Features(fp16=True, bf16=True, fp64=True, async_copy=True),
        limits=Limits(memory_bytes=memory, max_alloc_bytes=memory, compute_units=4 + 4 * index),
        performance=PerformanceHints(
            peak_gflops={DType.F32: gflops, DType.F64: gflops / 2},
            bandwidth_gbs=1.0 + index,
            launch_latency_us=10.0,
            power_watts=watts,
        ),
    )


def probe() -> list[DeviceInfo]:
    global CALLS
    CALLS += 1
    return [
        DeviceInfo(
            device=Device("fakegpu", i),
            backend="fakegpu",
            name=name,
            vendor="accelkit tests",
            memory_bytes=memory,
            compute_units=4 + 4 * i,
            capabilities=capabilities(i),
        )
        for i, (name, _gflops, memory, _watts) in DEVICES.items()
    ]
