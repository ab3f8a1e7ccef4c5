"""The CUDA backend's plugin descriptor. Imports no CuPy and loads no driver."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor
from accelkit_cuda import __version__

DESCRIPTOR = PluginDescriptor(
    name="cuda",
    distribution="accelkit-cuda",
    version=__version__,
    api_version="3.0",
    device_kinds=frozenset({"cuda"}),
    priority=10,
    backend_class="accelkit_cuda.backend:CUDABackend",
    probe="accelkit_cuda.probe:probe",
    summary="NVIDIA GPUs through CuPy: cuBLAS GEMM, NVRTC-compiled fused kernels, CUDA streams",
    hardware_hint="an NVIDIA GPU and driver (nvidia-smi lists it), and cupy-cuda12x or cupy-cuda13x",
)
