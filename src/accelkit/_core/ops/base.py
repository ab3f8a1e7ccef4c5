"""What every user-facing component shares: the owning backend, its kernel object, and output
allocation through that kernel object."""

from __future__ import annotations

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

    __slots__ = ("backend", "kernels")

    def __init__(self, backend: ComputeBackend, kernels: K) -> None:
        self.backend = backend
        self.kernels: K = kernels

    def _empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        return self.kernels.empty(shape, dtype)

    def _view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return self.kernels.view(x, shape)
