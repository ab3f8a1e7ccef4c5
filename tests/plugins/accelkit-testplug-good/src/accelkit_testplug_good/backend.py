"""``FakeGPUBackend``: the CPU backend's kernels, presented as two ``fakegpu`` devices.

Listing plugins must never import this module; tests look for it (and for the marker below) in
``sys.modules``.
"""

from __future__ import annotations

from accelkit.backends.cpu.backend import CPUBackend
from accelkit.capabilities import BackendCapabilities
from accelkit.device import Device
from accelkit.errors import InvalidArgumentError
from accelkit_testplug_good.probe import DEVICES, capabilities

#: Set when this module is imported: the registry must import it only when a backend is created.
BACKEND_MODULE_IMPORTED = True


class FakeGPUBackend(CPUBackend):
    """Two fake devices, ``fakegpu:0`` (slow) and ``fakegpu:1`` (fast), computing on the host."""

    name = "fakegpu"
    version = "0.1.0"
    device_kinds = frozenset({"fakegpu"})

    def supports_device(self, device: Device | str) -> bool:
        try:
            d = Device.parse(device)
        except InvalidArgumentError:
            return False
        return d.kind == "fakegpu" and d.index in DEVICES

    @property
    def capabilities(self) -> BackendCapabilities:
        device = self.device or self.selected_device or Device("fakegpu", 0)
        return capabilities(device.index)
