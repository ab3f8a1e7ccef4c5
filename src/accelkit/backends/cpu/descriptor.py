"""The CPU backend's plugin descriptor. Imports nothing heavy: listing backends stays cheap.

accelkit registers it through its own entry point, exactly as an outside plugin would.
"""

from __future__ import annotations

from accelkit import __version__
from accelkit.plugins import PluginDescriptor

DESCRIPTOR = PluginDescriptor(
    name="cpu",
    distribution="accelkit",
    version=__version__,
    api_version="3.0",
    device_kinds=frozenset({"cpu"}),
    priority=0,
    backend_class="accelkit.backends.cpu.backend:CPUBackend",
    probe="accelkit.backends.cpu.probe:probe",
    summary="NumPy on the host CPU: always available, the numerical reference",
)
