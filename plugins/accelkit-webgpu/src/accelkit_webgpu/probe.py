"""The WebGPU probe: every adapter wgpu-py reports, as ``webgpu:N``, read without a device.

wgpu is imported inside :func:`adapters` (after ``find_spec`` says it is there), so importing this
module costs nothing. Enumerating adapters asks the drivers what they have; no device is
requested and no shader is compiled.

A software adapter (Mesa's llvmpipe or lavapipe, Microsoft's WARP, SwiftShader) is listed and
marked ``software`` in the capabilities' ``extra``, with performance hints low enough that the
selector ranks it below any real GPU and below the CPU backend.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import DeviceError
from accelkit.sdk import BINARY_OPS, COMPOSED_OPS, UNARY_OPS
from accelkit_webgpu import kernels_linalg as _linalg
from accelkit_webgpu import kernels_nn as _nn
from accelkit_webgpu import kernels_reduce as _reduce
from accelkit_webgpu import kernels_shape as _shape
from accelkit_webgpu.fused_kernels import FUSED

__all__ = [
    "DTYPES",
    "IMPLEMENTED_OPS",
    "adapters",
    "capabilities",
    "is_software",
    "probe",
]

#: The dtypes every adapter gets. WGSL has f32, i32 and u32; the 8- and 16-bit types (and bool)
#: are stored packed in 32-bit words and computed in f32/i32/u32 (F16 and BF16 round once on
#: store, as NumPy does); I64 and U64 are pairs of words with exact emulated arithmetic
#: (accelkit_webgpu.int64). F64 is refused: emulating IEEE doubles is not worth its cost.
DTYPES: frozenset[DType] = frozenset(
    {
        DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32, DType.I16, DType.U16,
        DType.I8, DType.U8, DType.BOOL, DType.I64, DType.U64,
    }
)  # fmt: skip

#: The TensorOps this backend runs on the adapter today (declared exactly: the selector and the
#: conformance suite trust it).
#: Each kernel module lists what it makes work in its ``CLAIMS``.
IMPLEMENTED_OPS: frozenset[str] = (
    frozenset({*UNARY_OPS, *BINARY_OPS, "unary", "binary", "where", "cast"})
    | _shape.CLAIMS
    | _reduce.CLAIMS
    | _linalg.CLAIMS
    | _nn.CLAIMS
    # the core's compositions of the kernels above run on the adapter as those kernels do
    | COMPOSED_OPS
    | {"gaussian_blur", "sobel_edges", "grayscale", "threshold", "brightness", "contrast",
       "invert_colors", "sharpen"}
)  # fmt: skip

_SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "softpipe", "swiftshader", "warp", "basic render")


@functools.cache
def adapters() -> tuple[Any, ...]:
    """Every ``wgpu.GPUAdapter`` wgpu-py enumerates, in ``webgpu:N`` order (cached: the list is
    the same for the life of the process).

    Raises DeviceError with the reason when wgpu-py or every adapter is missing."""
    if importlib.util.find_spec("wgpu") is None:
        raise DeviceError("wgpu-py is not installed: pip install accelkit-webgpu")
    try:
        import wgpu
    except Exception as exc:  # a missing wgpu-native library, say
        raise DeviceError(f"wgpu-py failed to import: {exc}") from None
    try:
        found = tuple(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:
        raise DeviceError(f"wgpu-py could not enumerate adapters: {exc}") from None
    if not found:
        raise DeviceError(
            "wgpu-py found no adapter: install a Vulkan, Metal or D3D12 driver, or Mesa (llvmpipe)"
        )
    return found


def _info(adapter: Any) -> dict[str, Any]:
    return dict(adapter.info)


def is_software(info: dict[str, Any]) -> bool:
    """Whether an adapter is a software rasterizer running on the CPU."""
    name = f"{info.get('device', '')} {info.get('description', '')}".lower()
    return str(info.get("adapter_type", "")).lower() == "cpu" or any(
        s in name for s in _SOFTWARE_NAMES
    )


def capabilities(adapter: Any, index: int) -> BackendCapabilities:
    """What the backend does on ``adapter``, from its reported info, limits and features."""
    info = _info(adapter)
    limits = dict(adapter.limits)
    features = frozenset(str(f) for f in adapter.features)
    software = is_software(info)
    max_buffer = int(limits.get("max-buffer-size", 0))
    max_binding = int(limits.get("max-storage-buffer-binding-size", 0))
    wg = int(limits.get("max-compute-invocations-per-workgroup", 256))
    # WebGPU does not report device memory. A discrete GPU's is unknown here: the selector
    # gets the largest binding times 32 as a floor estimate; a software adapter uses host RAM.
    memory = max(max_buffer, max_binding) * (4 if software else 32)
    dtypes = DTYPES  # the same on every adapter: F16 is always emulated (shader-f16 unused)
    peak = {DType.F32: 2.0 if software else 2000.0}
    return BackendCapabilities(
        backend="webgpu",
        device=f"webgpu:{index}",
        dtypes=dtypes,
        ops=IMPLEMENTED_OPS,
        fused_ops=FUSED,
        # SPIR-V only where the adapter's API takes it (wgpu passes it through on Vulkan)
        kernel_languages=frozenset(
            {"wgsl", "spirv"} if str(info.get("backend_type", "")) == "Vulkan" else {"wgsl"}
        ),
        features=Features(
            fp16=DType.F16 in dtypes,
            bf16=DType.BF16 in dtypes,
            fp64=False,
            unified_memory=software,
            async_copy=True,
            custom_kernels=True,
        ),
        limits=Limits(
            memory_bytes=memory,
            max_alloc_bytes=max_binding,
            compute_units=0,
            max_work_group_size=wg,
        ),
        performance=PerformanceHints(
            peak_gflops=peak,
            bandwidth_gbs=1.0 if software else 200.0,
            launch_latency_us=250.0 if software else 30.0,
            power_watts=15.0 if software else 100.0,
        ),
        extra={
            "software": software,
            "backend_type": str(info.get("backend_type", "")),
            "adapter_type": str(info.get("adapter_type", "")),
            "description": str(info.get("description", "")),
            "vendor_id": int(info.get("vendor_id", 0) or 0),
            "device_id": int(info.get("device_id", 0) or 0),
            "features": sorted(features),
            "shader_f16": "shader-f16" in features,
            "timestamp_query": "timestamp-query" in features,
            "limits": {k: int(v) for k, v in sorted(limits.items())},
        },
    )


def probe() -> list[DeviceInfo]:
    infos = []
    for index, adapter in enumerate(adapters()):
        info = _info(adapter)
        caps = capabilities(adapter, index)
        name = str(info.get("device") or info.get("description") or "WebGPU adapter")
        infos.append(
            DeviceInfo(
                device=Device("webgpu", index),
                backend="webgpu",
                name=f"{name} ({caps.extra['backend_type']})",
                vendor=str(info.get("vendor", "")),
                memory_bytes=caps.limits.memory_bytes,
                compute_units=0,
                capabilities=caps,
                extra={
                    "software": caps.extra["software"],
                    "backend_type": caps.extra["backend_type"],
                    "adapter_type": caps.extra["adapter_type"],
                    "max_buffer_bytes": caps.extra["limits"].get("max-buffer-size", 0),
                    "max_binding_bytes": caps.limits.max_alloc_bytes,
                    "shader_f16": caps.extra["shader_f16"],
                },
            )
        )
    return infos
