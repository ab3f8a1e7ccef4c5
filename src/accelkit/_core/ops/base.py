"""What every part of TensorOps shares: the owning backend and output allocation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from accelkit.dtype import DType
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = ["OpsBase"]


class OpsBase(ABC):
    """Base of the TensorOps parts (and of KernelOps sub-interfaces). An abstract base: a
    subclass that leaves an ``@abstractmethod`` hook unimplemented cannot be instantiated (it
    fails at once, naming the method, instead of computing garbage at run time)."""

    def __init__(self, backend: ComputeBackend) -> None:
        self.backend = backend

    @abstractmethod
    def _empty(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """Allocate an output tensor (validated shape and dtype) on the backend's device."""

    @abstractmethod
    def _view(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A tensor sharing ``x``'s buffer with another shape of the same size."""
