"""The OpenCL probe: every device of every platform as ``opencl:N``, read without a context.

PyOpenCL is imported inside :func:`probe` (and only after ``find_spec`` says it is there), so
importing this module costs nothing; listing devices asks the ICD loader for platforms and device
properties and never creates a context or compiles anything.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import DeviceError
from accelkit.sdk import BINARY_OPS, COMPOSED_OPS, KERNEL_OPS, REDUCE_OPS, UNARY_OPS

__all__ = ["IMPLEMENTED_OPS", "capabilities", "cl_devices", "device_dtypes", "probe"]

#: The TensorOps this backend runs on the device today (declared exactly: the
#: selector trusts it).
IMPLEMENTED_OPS: frozenset[str] = frozenset(
    {*UNARY_OPS, *BINARY_OPS, *REDUCE_OPS, *COMPOSED_OPS}
    | {
        "unary", "binary", "where", "cast", "gemm", "batched_gemm", "matmul", "linear",
        "reduce", "softmax", "log_softmax", "layer_norm", "rms_norm", "reshape", "transpose",
        "attention", "cross_entropy", "adam_update",
        "permute", "concat", "split", "stack", "narrow", "gather", "scatter", "conv2d",
        "embedding", "gaussian_blur", "sobel_edges", "grayscale", "threshold", "brightness",
        "contrast", "invert_colors", "sharpen",
    }
)  # fmt: skip

_BASE_DTYPES = frozenset(
    {
        DType.F32, DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32,
        DType.U64, DType.BOOL,
    }
)  # fmt: skip


def cl_devices() -> list[Any]:
    """Every ``pyopencl.Device`` of every platform, in ``opencl:N`` order.

    Raises DeviceError with the reason when PyOpenCL or any platform is missing."""
    if importlib.util.find_spec("pyopencl") is None:
        raise DeviceError("PyOpenCL is not installed: pip install 'accelkit-opencl[pocl]'")
    from accelkit_opencl.caches import use_private_pocl_cache

    use_private_pocl_cache()  # before the platform loads: PoCL reads it once
    try:
        import pyopencl as cl
    except Exception as exc:  # a broken build or a missing shared library
        raise DeviceError(f"PyOpenCL failed to import: {exc}") from None
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise DeviceError(
            f"no OpenCL platform found ({exc}); install a driver (ICD) or pyopencl[pocl]"
        ) from None
    if not platforms:
        raise DeviceError("no OpenCL platform found; install a driver (ICD) or pyopencl[pocl]")
    devices: list[Any] = []
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error:  # a platform without devices answers DEVICE_NOT_FOUND
            continue
    return devices


def device_dtypes(extensions: str) -> frozenset[DType]:
    """The dtypes the device really has: F64 only with cl_khr_fp64, F16 only with cl_khr_fp16."""
    ext = set(extensions.split())
    dtypes = set(_BASE_DTYPES)
    if "cl_khr_fp64" in ext:
        dtypes.add(DType.F64)
    if "cl_khr_fp16" in ext:
        dtypes.add(DType.F16)
    return frozenset(dtypes)


def capabilities(device: Any, index: int) -> BackendCapabilities:
    """What the backend does on ``device`` (a ``pyopencl.Device``), from its reported properties."""
    import pyopencl as cl

    extensions = device.extensions
    try:
        il_version = str(device.il_version).strip()  # SPIR-V (OpenCL 2.1 / cl_khr_il_program)
    except (cl.Error, AttributeError):
        il_version = ""
    dtypes = device_dtypes(extensions)
    units = int(device.max_compute_units)
    ghz = max(int(device.max_clock_frequency), 1) / 1000.0
    is_gpu = bool(device.type & cl.device_type.GPU)
    # Declared estimates of what these kernels reach, not the hardware's peak: on a CPU device
    # (PoCL) about 2 FLOP per cycle and core, on a GPU 64 lanes per compute unit.
    f32 = units * ghz * (128.0 if is_gpu else 2.0)
    peak = {DType.F32: round(f32, 1)}
    if DType.F64 in dtypes:
        peak[DType.F64] = round(f32 / (8.0 if is_gpu else 2.0), 1)
    if DType.F16 in dtypes:
        peak[DType.F16] = round(f32, 1)
    memory = int(device.global_mem_size)
    return BackendCapabilities(
        backend="opencl",
        device=f"opencl:{index}",
        dtypes=dtypes,
        ops=IMPLEMENTED_OPS,
        fused_ops=KERNEL_OPS,
        kernel_languages=frozenset({"opencl", "spirv"} if il_version else {"opencl"}),
        features=Features(
            fp16=DType.F16 in dtypes,
            fp64=DType.F64 in dtypes,
            unified_memory=bool(getattr(device, "host_unified_memory", False)),
            async_copy=True,
            custom_kernels=True,
        ),
        limits=Limits(
            memory_bytes=memory,
            max_alloc_bytes=int(device.max_mem_alloc_size),
            compute_units=units,
            max_work_group_size=int(device.max_work_group_size),
        ),
        performance=PerformanceHints(
            peak_gflops=peak,
            bandwidth_gbs=200.0 if is_gpu else 10.0,
            launch_latency_us=20.0 if is_gpu else 30.0,
            power_watts=150.0 if is_gpu else 15.0 * units,
        ),
        extra={
            "platform": device.platform.name.strip(),
            # PyOpenCL's stubs do not declare the enum classes' to_string:
            "device_type": cl.device_type.to_string(device.type),  # type: ignore[operator]
            "opencl_version": device.version.strip(),
            "driver_version": device.driver_version.strip(),
            "max_work_item_sizes": [int(s) for s in device.max_work_item_sizes],
            "local_mem_bytes": int(device.local_mem_size),
            "extensions": sorted(extensions.split()),
            "il_version": il_version,
        },
    )


def probe() -> list[DeviceInfo]:
    infos = []
    for index, device in enumerate(cl_devices()):
        caps = capabilities(device, index)
        infos.append(
            DeviceInfo(
                device=Device("opencl", index),
                backend="opencl",
                name=device.name.strip(),
                vendor=device.vendor.strip(),
                memory_bytes=caps.limits.memory_bytes,
                compute_units=caps.limits.compute_units,
                capabilities=caps,
                extra={
                    "platform": caps.extra["platform"],
                    "max_work_group_size": caps.limits.max_work_group_size,
                    "max_work_item_sizes": caps.extra["max_work_item_sizes"],
                    "fp64": caps.features.fp64,
                    "fp16": caps.features.fp16,
                },
            )
        )
    return infos
