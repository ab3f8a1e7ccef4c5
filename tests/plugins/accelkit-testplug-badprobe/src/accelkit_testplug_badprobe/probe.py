"""A probe that fails the way a buggy driver binding does: not with a clean DeviceError."""

from __future__ import annotations

from accelkit.device import DeviceInfo


def probe() -> list[DeviceInfo]:
    raise RuntimeError("accelkit-testplug-badprobe: the probe fails, on purpose")
