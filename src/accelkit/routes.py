"""``Route``: which implementation ran one call, and why.

KernelOps records one per call (``fused`` or ``composed``, in ``backend.kernel_ops.last_route``)
and the opt-in fallback one per call it moved to another backend (``fallback``, in
``backend.fallback.events``): one shape for every kind of rerouting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Route", "RouteName"]

RouteName = Literal["fused", "composed", "fallback"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One call's route: ``op`` on ``backend`` ran ``route`` because of ``reason``;
    ``fallback`` names the backend that ran it instead (``route == "fallback"`` only)."""

    op: str
    backend: str
    route: RouteName
    reason: str
    fallback: str | None = None
