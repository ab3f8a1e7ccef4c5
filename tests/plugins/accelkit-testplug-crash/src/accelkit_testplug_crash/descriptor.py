"""The descriptor accelkit reads to list ``crash``."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor

DESCRIPTOR = PluginDescriptor(
    name="crash",
    distribution="accelkit-testplug-crash",
    version="0.1.0",
    api_version="3.0",
    device_kinds=frozenset({"crash"}),
    # Below the CPU backend's, with declared figures far below the CPU's: never selected unless
    # asked for by name.
    priority=-100,
    backend_class="accelkit_testplug_crash.backend:CrashBackend",
    probe="accelkit_testplug_crash.probe:probe",
    summary="[accelkit test plugin] the CPU kernels, except a matmul that aborts the process",
)
