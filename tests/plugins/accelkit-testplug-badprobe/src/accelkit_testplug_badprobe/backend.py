"""The backend of a plugin whose probe fails (never reached through selection)."""

from __future__ import annotations

from accelkit.backends.cpu.backend import CPUBackend


class BadProbeBackend(CPUBackend):
    name = "badprobe"
    device_kinds = frozenset({"badprobe"})
