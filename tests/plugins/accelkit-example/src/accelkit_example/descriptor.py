"""What accelkit reads to list this plugin. Imports nothing but accelkit.plugins."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor
from accelkit_example import __version__

DESCRIPTOR = PluginDescriptor(
    name="example",                       # == the entry point's name
    distribution="accelkit-example",      # == the distribution's name
    version=__version__,
    api_version="3.0",                    # the accelkit plugin API this was built for
    device_kinds=frozenset({"example"}),  # devices are "example:0", "example:1", ...
    priority=0,                           # breaks ties between equally good candidates
    backend_class="accelkit_example.backend:ExampleBackend",
    probe="accelkit_example.probe:probe",
    summary="an example device: untyped host memory, kernels on a worker thread",
    hardware_hint="always present (it is the host)",
)  # fmt: skip
