"""The descriptor accelkit reads to list ``fakegpu``; it imports nothing but accelkit.plugins."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor

DESCRIPTOR = PluginDescriptor(
    name="fakegpu",
    distribution="accelkit-testplug-good",
    version="0.1.0",
    api_version="3.0",
    device_kinds=frozenset({"fakegpu"}),
    # Below the CPU backend's, and its declared figures are far below the CPU's, so that having
    # the test plugins installed does not change what the rest of the suite selects by default.
    priority=-100,
    backend_class="accelkit_testplug_good.backend:FakeGPUBackend",
    probe="accelkit_testplug_good.probe:probe",
    summary="[accelkit test plugin] a fake GPU with a slow and a fast device, computing on the host",
)
