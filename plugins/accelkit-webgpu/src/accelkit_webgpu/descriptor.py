"""The WebGPU backend's plugin descriptor. Imports no wgpu: listing backends stays cheap."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor
from accelkit_webgpu import __version__

DESCRIPTOR = PluginDescriptor(
    name="webgpu",
    distribution="accelkit-webgpu",
    version=__version__,
    api_version="3.0",
    device_kinds=frozenset({"webgpu"}),
    priority=0,
    backend_class="accelkit_webgpu.backend:WebGPUBackend",
    probe="accelkit_webgpu.probe:probe",
    summary="WGSL compute shaders on a WebGPU adapter (Vulkan, Metal, D3D12 or OpenGL)",
    hardware_hint="wgpu-py finds an adapter (a GPU driver, or Mesa's llvmpipe as a software one)",
)
