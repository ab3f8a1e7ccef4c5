"""What every user-facing component shares: the owning backend, its kernel object, and output
allocation through that kernel object."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from accelkit.dtype import DType
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.sdk.kernels import _Allocating

__all__ = ["OpsBase", "check_result_fits"]

K = TypeVar("K", bound="_Allocating")


def check_result_fits(
    backend: ComputeBackend, op: str, shape: tuple[int, ...], dtype: DType
) -> tuple[int, ...]:
    """A composed op's result shape, refused before any work (host index arrays included) when
    it is absurd or larger than one allocation of the device may be: OutOfMemoryError."""
    from accelkit._core.validation import check_shape
    from accelkit.errors import OutOfMemoryError

    dims = check_shape(shape, f"{op}: the result shape")
    limits = backend.capabilities.limits
    limit = limits.max_alloc_bytes or limits.memory_bytes
    size = 1
    for d in dims:
        size *= d
    # The host index of the longest axis (8 bytes an element) must fit as well.
    need = max(size * dtype.itemsize, 8 * max(dims, default=0))
    if limit and need > limit:
        raise OutOfMemoryError(
            f"{op}: the result {dims} ({dtype.value}) needs {need} bytes; one allocation on"
            f" {backend.name} holds at most {limit}",
            requested=need,
            limit=limit,
        )
    return dims


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
