"""What every user-facing component shares: the owning backend, its kernel object, and output
allocation through that kernel object."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from accelkit.dtype import DType
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit._core.kernel_api import _Allocating
    from accelkit.abc.backend import ComputeBackend

__all__ = ["OpsBase"]

K = TypeVar("K", bound="_Allocating")


class OpsBase(Generic[K]):
    """Base of the TensorOps parts, TensorFactory and KernelOps: validation lives in the
    subclasses, the work in ``kernels`` (a backend's :mod:`accelkit.sdk` kernel object)."""

    __slots__ = ("_empty", "_view", "backend", "kernels")

    def __init__(self, backend: ComputeBackend, kernels: K) -> None:
        self.backend = backend
        self.kernels: K = kernels
        # The kernel object's allocators, bound once: every op allocates its output through
        # ``_empty``, and a bound method saves a call frame per op.
        self._empty: Callable[[tuple[int, ...], DType], Tensor] = kernels.empty
        self._view: Callable[[Tensor, tuple[int, ...]], Tensor] = kernels.view
