"""The CPU backend's plugin descriptor. Imports nothing heavy: listing backends stays cheap."""

from __future__ import annotations

DESCRIPTOR = {
    "name": "cpu",
    "distribution": "accelkit",
    "api_version": "1.0",
    "device_kinds": ["cpu"],
    "priority": 0,
    "backend_class": "accelkit.backends.cpu.backend:CPUBackend",
    "summary": "NumPy on the host CPU: always available, the numerical reference",
}
