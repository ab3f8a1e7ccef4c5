"""A valid descriptor; the probe it names fails."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor

DESCRIPTOR = PluginDescriptor(
    name="badprobe",
    distribution="accelkit-testplug-badprobe",
    version="0.1.0",
    api_version="3.0",
    device_kinds=frozenset({"badprobe"}),
    priority=-100,
    backend_class="accelkit_testplug_badprobe.backend:BadProbeBackend",
    probe="accelkit_testplug_badprobe.probe:probe",
    summary="[accelkit test plugin] its probe raises RuntimeError",
)
