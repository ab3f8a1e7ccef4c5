"""A well-formed descriptor for a plugin API this accelkit (1.x) does not implement."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor

DESCRIPTOR = PluginDescriptor(
    name="future",
    distribution="accelkit-testplug-future",
    version="9.0.0",
    api_version="4.0",
    device_kinds=frozenset({"future"}),
    backend_class="accelkit_testplug_future.backend:FutureBackend",
    probe="accelkit_testplug_future.backend:probe",
    summary="[accelkit test plugin] built for plugin API 3.0; accelkit 2.x must refuse it",
)
