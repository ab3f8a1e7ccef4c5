"""The user-facing components over a backend's kernels: :class:`TensorOps`, :class:`TensorFactory`,
:class:`KernelOps` and :class:`MemoryManager`.

Each validates its arguments once, here, for every backend, allocates the outputs and calls the
backend's kernel objects (:mod:`accelkit.sdk`: TensorKernels, FactoryKernels, FusedKernels,
MemoryKernels), which only compute or copy. ``backend.tensor_ops``, ``backend.tensor_factory``,
``backend.kernel_ops`` and ``backend.memory_manager`` are instances of these classes; the
contracts a backend implements are in :mod:`accelkit.abc` (the backend, its streams and memory)
and :mod:`accelkit.sdk` (its kernels).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "KernelOps": "accelkit.ops.kernel_ops",
    "MemoryManager": "accelkit.ops.memory",
    "TensorFactory": "accelkit.ops.factory",
    "TensorOps": "accelkit.ops.tensor_ops",
}

__all__ = ["KernelOps", "MemoryManager", "TensorFactory", "TensorOps"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'accelkit.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from accelkit.ops.factory import TensorFactory
    from accelkit.ops.kernel_ops import KernelOps
    from accelkit.ops.memory import MemoryManager
    from accelkit.ops.tensor_ops import TensorOps
