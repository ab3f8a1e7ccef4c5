"""The functions users call first: ``create_backend`` and ``open_backend``.

For now they know the embedded CPU backend; the plugin registry and selector (entry points,
ranking, explanations) build on the same two functions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from accelkit.abc.backend import ComputeBackend
from accelkit.device import Device
from accelkit.errors import BackendNotFoundError, InvalidArgumentError

__all__ = ["create_backend", "open_backend"]


def _builtin(name: str) -> type[ComputeBackend]:
    if name == "cpu":
        from accelkit.backends.cpu.backend import CPUBackend

        return CPUBackend
    raise BackendNotFoundError(f"no backend named {name!r} is installed; installed: cpu")


def create_backend(target: str | Device = "cpu") -> ComputeBackend:
    """A backend (not yet initialized) for a backend name (``"cpu"``) or a device (``"cpu:0"``)."""
    if isinstance(target, Device):
        return _builtin(target.kind)()
    if not isinstance(target, str):
        raise InvalidArgumentError(
            f"create_backend takes a backend name or a device; got {type(target).__name__}"
        )
    return _builtin(Device.parse(target).kind)()


@asynccontextmanager
async def open_backend(target: str | Device = "cpu") -> AsyncIterator[ComputeBackend]:
    """Create, initialize and (on exit, whatever happens) shut down a backend."""
    backend = create_backend(target)
    device = target if isinstance(target, Device) or ":" in str(target) else None
    await backend.initialize(device)
    try:
        yield backend
    finally:
        await backend.shutdown()
