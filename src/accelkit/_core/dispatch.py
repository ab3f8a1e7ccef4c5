"""``KernelDispatcher``: KernelOps with route records of its own (the 1.x spelling).

Since Plugin API 2.0 ``backend.kernel_ops`` always exists and routes every op itself (fused
where the backend has the kernel, composed otherwise); a dispatcher is a KernelOps over the
backend's kernels with separate ``routes``/``last_route``, e.g. ``prefer="composed"`` to check
a fused kernel against its composition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelkit.abc.kernel_ops import KernelOps
from accelkit.routes import Route, RouteName

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = ["KernelDispatcher", "Route"]


class KernelDispatcher(KernelOps):
    """``backend.kernel_ops``'s ops with their own route records (see the module docstring).
    The backend must be initialized."""

    __slots__ = ()

    def __init__(self, backend: ComputeBackend, prefer: RouteName = "fused") -> None:
        super().__init__(backend, backend.kernel_ops.kernels, prefer)

    def __repr__(self) -> str:
        return f"<KernelDispatcher {self.backend.name} prefer={self.prefer}>"
