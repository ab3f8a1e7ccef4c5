"""The descriptor accelkit reads to list ``subset``."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor

DESCRIPTOR = PluginDescriptor(
    name="subset",
    distribution="accelkit-testplug-subset",
    version="0.1.0",
    api_version="3.0",
    device_kinds=frozenset({"subset"}),
    priority=-100,
    backend_class="accelkit_testplug_subset.backend:SubsetBackend",
    probe="accelkit_testplug_subset.probe:probe",
    summary="[accelkit test plugin] the CPU kernels without attention, for fallback tests",
)
