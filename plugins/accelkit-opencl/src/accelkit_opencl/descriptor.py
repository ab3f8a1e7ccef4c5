"""The OpenCL backend's plugin descriptor. Imports no pyopencl: listing backends stays cheap."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor
from accelkit_opencl import __version__

DESCRIPTOR = PluginDescriptor(
    name="opencl",
    distribution="accelkit-opencl",
    version=__version__,
    api_version="3.0",
    device_kinds=frozenset({"opencl"}),
    priority=0,
    backend_class="accelkit_opencl.backend:OpenCLBackend",
    probe="accelkit_opencl.probe:probe",
    summary="OpenCL C kernels on any OpenCL device (GPUs, or the CPU through PoCL)",
    hardware_hint="an OpenCL ICD is installed (clinfo lists a platform), or pyopencl[pocl]",
)
