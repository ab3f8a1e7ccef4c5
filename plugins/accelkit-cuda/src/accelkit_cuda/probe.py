"""The CUDA probe: devices and capabilities from the driver library, without importing CuPy.

:func:`capabilities` is a pure function of the driver's properties (compute capability, clocks,
multiprocessors, memory bus), so what a device can do is decided in one place and tested without
a GPU. Peak figures are the usual spec-sheet arithmetic (units x clock x operations per clock);
``accelkit calibrate`` replaces them with measurements.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from accelkit.capabilities import BackendCapabilities, Features, Limits, PerformanceHints
from accelkit.device import Device, DeviceInfo
from accelkit.dtype import DType
from accelkit.errors import DeviceError
from accelkit.sdk import BINARY_OPS, COMPOSED_OPS, KERNEL_OPS, REDUCE_OPS, UNARY_OPS
from accelkit_cuda.driver import Attr, DeviceProps, DriverUnavailable, read_devices

__all__ = [
    "IMPLEMENTED_OPS", "attention_engine", "backend_dtypes", "capabilities", "cupy_status", "probe",
]  # fmt: skip

#: TensorOps and KernelOps this backend runs on the GPU (declared exactly: the selector trusts it).
IMPLEMENTED_OPS: frozenset[str] = frozenset(
    {*UNARY_OPS, *BINARY_OPS, *REDUCE_OPS, *COMPOSED_OPS}
    | {
        "unary", "binary", "where", "cast", "gemm", "batched_gemm", "matmul", "linear",
        "reduce", "softmax", "log_softmax", "layer_norm", "rms_norm", "reshape", "transpose",
        "attention", "cross_entropy", "adam_update", "permute", "concat", "split", "stack",
        "narrow", "gather", "scatter", "conv2d", "embedding", "gaussian_blur", "sobel_edges",
        "grayscale", "threshold", "brightness", "contrast", "invert_colors", "sharpen",
    }
)  # fmt: skip

#: FP32 lanes per multiprocessor, by compute capability major (minor where it differs).
_FP32_LANES = {(6, 0): 64, (7, 0): 64, (7, 5): 64, (8, 0): 64}
#: Dense tensor-core F16 FLOPs (f32 accumulate) per multiprocessor and clock.
_TENSOR_F16 = {
    (7, 0): 1024, (7, 5): 1024, (8, 0): 2048, (8, 6): 1024, (8, 7): 1024, (8, 9): 1024,
    (9, 0): 4096, (10, 0): 8192, (12, 0): 1024,
}  # fmt: skip
#: (the data-centre parts' rates; GeForce cards of the same generation halve F16 with F32
#: accumulation)


def _by_cc(table: dict[tuple[int, int], int], cc: tuple[int, int], default: int) -> int:
    if cc in table:
        return table[cc]
    same_major = [v for (major, _), v in table.items() if major == cc[0]]
    return same_major[0] if same_major else default


def cupy_bf16() -> bool:
    """Whether the installed CuPy holds bfloat16 arrays: CuPy 14 or later, with ml_dtypes (read
    from the installed distributions, without importing CuPy)."""
    if importlib.util.find_spec("ml_dtypes") is None:
        return False
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        try:
            return int(version.split(".")[0]) >= 14
        except ValueError:
            return False
    return False


def backend_dtypes(cc: tuple[int, int], bf16: bool | None = None) -> frozenset[DType]:
    """What the backend computes in on a device of compute capability ``cc``.

    BF16 is among them from compute capability 8.0 up (native bf16 conversions and tensor
    cores) where CuPy holds bf16 arrays (``bf16``, by default :func:`cupy_bf16`): storage,
    elementwise ops and reductions computed in F32 and rounded once, GEMMs on cuBLAS (bf16 in,
    F32 accumulation), attention and the norms (fused NVRTC kernels and the compositions)."""
    dtypes = {
        DType.F32, DType.F64, DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16,
        DType.U32, DType.U64, DType.BOOL,
    }  # fmt: skip
    if cc >= (5, 3):
        dtypes.add(DType.F16)
    if cc >= (8, 0) and (cupy_bf16() if bf16 is None else bf16):
        dtypes.add(DType.BF16)
    return frozenset(dtypes)


def attention_engine(cc: tuple[int, int]) -> tuple[str, str]:
    """Which engine would serve attention on a device of compute capability ``cc``, and why,
    from what is installed (no import: the probe's answer; an open backend's capabilities say
    what it found when it loaded the library)."""
    from accelkit_cuda.cudnn_attention import frontend_status

    why = frontend_status()
    if why is None and cc < (8, 0):
        why = "cuDNN's SDPA needs compute capability 8.0 or newer"
    if why is None:
        return "cudnn", "nvidia-cudnn-frontend is installed (its library is loaded at open)"
    return "nvrtc", why


def capabilities(
    props: DeviceProps, attention: tuple[str, str] | None = None
) -> BackendCapabilities:
    """What the backend does on the device ``props`` describes; ``attention`` is the engine
    serving attention and why (by default :func:`attention_engine`'s guess)."""
    cc = props.compute_capability
    engine, engine_note = attention_engine(cc) if attention is None else attention
    sms = props.attr(Attr.MULTIPROCESSOR_COUNT)
    ghz = props.attr(Attr.CLOCK_RATE) / 1e6
    fp32 = sms * ghz * 2 * _by_cc(_FP32_LANES, cc, 128)
    tensor_cores = cc >= (7, 0)
    peak: dict[DType, float] = {DType.F32: round(fp32, 1)}
    # FP64 runs at 1/2 rate on the data-centre parts (x.0), 1/32 or 1/64 on the others.
    peak[DType.F64] = round(fp32 / (2 if cc[1] == 0 and cc[0] in (6, 7, 8, 9, 10) else 64), 1)
    if tensor_cores:
        peak[DType.F16] = round(sms * ghz * _by_cc(_TENSOR_F16, cc, 1024), 1)
    else:
        peak[DType.F16] = round(fp32 * 2 if cc >= (5, 3) else fp32, 1)
    bandwidth = (
        props.attr(Attr.MEMORY_CLOCK_RATE) * 1e3 * 2 * props.attr(Attr.GLOBAL_MEMORY_BUS_WIDTH) / 8
    ) / 1e9
    major, minor = cc
    return BackendCapabilities(
        backend="cuda",
        device=f"cuda:{props.index}",
        dtypes=backend_dtypes(cc),
        ops=IMPLEMENTED_OPS,
        fused_ops=KERNEL_OPS,
        kernel_languages=frozenset({"cuda"}),
        features=Features(
            fp16=cc >= (5, 3),
            bf16=cc >= (8, 0),
            fp64=True,
            unified_memory=bool(props.attr(Attr.MANAGED_MEMORY)),
            async_copy=True,
            custom_kernels=True,
            graphs=True,
        ),
        limits=Limits(
            memory_bytes=props.total_memory,
            max_alloc_bytes=props.total_memory,
            compute_units=sms,
            max_work_group_size=props.attr(Attr.MAX_THREADS_PER_BLOCK),
        ),
        performance=PerformanceHints(
            peak_gflops=peak,
            bandwidth_gbs=round(bandwidth, 1),
            launch_latency_us=8.0,
            power_watts=300.0 if (major >= 8 and minor == 0) or major >= 9 else 200.0,
        ),
        extra={
            "compute_capability": f"{major}.{minor}",
            "arch": f"sm_{major}{minor}",
            "tensor_cores": tensor_cores,
            "fp8": cc >= (8, 9),
            "multiprocessors": sms,
            "clock_mhz": props.attr(Attr.CLOCK_RATE) // 1000,
            "shared_memory_per_block": props.attr(Attr.MAX_SHARED_MEMORY_PER_BLOCK),
            "shared_memory_per_block_optin": props.attr(Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            "l2_cache_bytes": props.attr(Attr.L2_CACHE_SIZE),
            "warp_size": props.attr(Attr.WARP_SIZE, 32),
            "driver_cuda_version": f"{props.driver_version // 1000}.{props.driver_version % 1000 // 10}",
            "memory_pools": bool(props.attr(Attr.MEMORY_POOLS_SUPPORTED)),
            # "cudnn" (cuDNN's SDPA graphs, f16/bf16) or "nvrtc" (the fused NVRTC kernel).
            "attention_engine": engine,
            "attention_engine_note": engine_note,
            # TF32 tensor cores exist (f32 GEMMs use them only with backend.allow_tf32).
            "tf32": cc >= (8, 0),
        },
    )


def cupy_status() -> str | None:
    """None when CuPy is installed; else why the backend cannot run (without importing it)."""
    if importlib.util.find_spec("cupy") is None:
        return (
            "CuPy is not installed: pip install 'accelkit-cuda[cuda12]' (or [cuda13], matching"
            " the driver's CUDA version)"
        )
    return None


def probe() -> list[DeviceInfo]:
    """Every CUDA device, from the driver library; DeviceError saying why when there are none."""
    try:
        devices = read_devices()
    except DriverUnavailable as exc:
        raise DeviceError(f"no CUDA devices: {exc}") from None
    if not devices:
        raise DeviceError("no CUDA devices: the driver lists none (CUDA_VISIBLE_DEVICES?)")
    missing = cupy_status()
    if missing is not None:
        raise DeviceError(f"{len(devices)} CUDA device(s) found, but {missing}")
    infos = []
    for props in devices:
        caps = capabilities(props)
        infos.append(
            DeviceInfo(
                device=Device("cuda", props.index),
                backend="cuda",
                name=props.name,
                vendor="NVIDIA",
                memory_bytes=props.total_memory,
                compute_units=caps.limits.compute_units,
                capabilities=caps,
                extra={
                    "compute_capability": caps.extra["compute_capability"],
                    "tensor_cores": caps.extra["tensor_cores"],
                    "bf16": caps.features.bf16,
                    "fp8": caps.extra["fp8"],
                },
            )
        )
    return infos
