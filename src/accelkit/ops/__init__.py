"""The user-facing components over a backend's kernels: :class:`TensorOps`, :class:`TensorFactory`
and :class:`KernelOps`.

Each validates its arguments once, here, for every backend, allocates the outputs and calls the
backend's kernel objects (:mod:`accelkit.sdk`: TensorKernels, FactoryKernels, FusedKernels),
which only compute. ``backend.tensor_ops``, ``backend.tensor_factory`` and
``backend.kernel_ops`` are instances of these classes; the contracts a backend implements are in
:mod:`accelkit.abc` (the backend, its streams and memory) and :mod:`accelkit.sdk` (its kernels).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "KernelOps": "accelkit.ops.kernel_ops",
    "TensorFactory": "accelkit.ops.factory",
    "TensorOps": "accelkit.ops.tensor_ops",
}

__all__ = ["KernelOps", "TensorFactory", "TensorOps"]


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
    from accelkit.ops.tensor_ops import TensorOps
