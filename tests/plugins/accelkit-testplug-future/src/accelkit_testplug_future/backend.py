"""What a plugin for another API version would bring in: it must never be imported.

Importing it does not fail (a refused plugin would often import fine and then misbehave); tests
check ``sys.modules`` and the marker below instead.
"""

from __future__ import annotations

from accelkit.backends.cpu.backend import CPUBackend
from accelkit.device import DeviceInfo

#: Set when this module is imported, which the version gate must prevent.
BACKEND_MODULE_IMPORTED = True


class FutureBackend(CPUBackend):
    name = "future"
    device_kinds = frozenset({"future"})


def probe() -> list[DeviceInfo]:
    return [DeviceInfo(device="future:0", backend="future", name="Future device")]
