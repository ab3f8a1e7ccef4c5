"""Reductions: sum mean max min prod argmax argmin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelkit._core.op_names import REDUCE_OPS
from accelkit._core.shapes import reduced_shape
from accelkit._core.validation import check_axes, check_axis, check_tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["REDUCE_OPS", "ReductionOps"]

#: (op, dtype, shape, axis, keepdims) -> (axes, result dtype, result shape) of reductions that
#: passed validation: a loop's reductions validate once. Bounded: cleared when full.
_SEEN: dict[tuple[object, ...], tuple[tuple[int, ...], DType, tuple[int, ...]]] = {}
_SEEN_MAX = 4096


class ReductionOps(OpsBase[TensorKernels]):
    """``reduce(op, x, axis=None, keepdims=False)`` and the named shortcuts.

    Dtypes: ``sum``/``prod`` of integers or bools give I64 (U64 for unsigned); ``mean`` of
    integers gives F32; ``max``/``min`` keep the dtype; ``argmax``/``argmin`` give I64 (first
    index of the extreme). Low-precision floats accumulate in F32.
    """

    def reduce(
        self,
        op: str,
        x: Tensor,
        axis: int | tuple[int, ...] | None = None,
        keepdims: bool = False,
    ) -> Tensor:
        if type(op) is not str or op not in REDUCE_OPS:
            raise InvalidArgumentError(
                f"unknown reduction {op!r}; expected one of: {', '.join(REDUCE_OPS)}"
            )
        check_tensor(self.backend, x)
        # What follows depends only on (op, dtype, shape, axis, keepdims): a call seen before
        # reuses its result (axis and keepdims of exact types only: True == 1 as a dict key).
        key: tuple[object, ...] | None = None
        if (axis is None or type(axis) is int) and type(keepdims) is bool:
            key = (op, x._dtype, x._shape, axis, keepdims)
            seen = _SEEN.get(key)
            if seen is not None:
                axes, dt, shape = seen
                out = self._empty(shape, dt)
                self.kernels.reduce(op, x, axes, keepdims, out)
                return out
        if type(keepdims) is not bool:  # "yes" was True on OpenCL, a DeviceError on the CPU
            raise InvalidArgumentError(f"{op}: keepdims must be a bool; got {keepdims!r}")
        if x.ndim == 0 and axis is not None:  # axis 0 or -1 of a 0-d tensor: its one element
            check_axes(axis, 0)
            return self.reduce(op, x, None, keepdims)
        if op in ("argmax", "argmin"):
            if axis is not None and not isinstance(axis, int):
                raise InvalidArgumentError(f"{op} takes one axis or None; got {axis!r}")
            axes = tuple(range(x.ndim)) if axis is None else (check_axis(axis, x.ndim),)
        else:
            axes = check_axes(axis, x.ndim)
        if op in ("max", "min", "argmax", "argmin") and any(x._shape[a] == 0 for a in axes):
            raise InvalidArgumentError(
                f"{op} of an empty axis is undefined; x has shape {x._shape}"
            )
        dt = x._dtype
        if op in ("sum", "prod") and not dt.is_floating:
            dt = DType.U64 if dt in (DType.U8, DType.U16, DType.U32, DType.U64) else DType.I64
        elif op == "mean" and not dt.is_floating:
            dt = DType.F32
        elif op in ("argmax", "argmin"):
            dt = DType.I64
        if op in ("argmax", "argmin") and axis is None:
            shape = (1,) * x.ndim if keepdims else ()
        else:
            shape = reduced_shape(x._shape, axes, keepdims)
        if key is not None:
            if len(_SEEN) >= _SEEN_MAX:
                _SEEN.clear()
            _SEEN[key] = (axes, dt, shape)
        out = self._empty(shape, dt)
        self.kernels.reduce(op, x, axes, keepdims, out)
        return out

    def sum(
        self, x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
    ) -> Tensor:
        return self.reduce("sum", x, axis, keepdims)

    def mean(
        self, x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
    ) -> Tensor:
        return self.reduce("mean", x, axis, keepdims)

    def max(
        self, x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
    ) -> Tensor:
        return self.reduce("max", x, axis, keepdims)

    def min(
        self, x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
    ) -> Tensor:
        return self.reduce("min", x, axis, keepdims)

    def prod(
        self, x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
    ) -> Tensor:
        return self.reduce("prod", x, axis, keepdims)

    def argmax(
        self, x: Tensor, axis: int | None = None, keepdims: bool = False, *, last: bool = False
    ) -> Tensor:
        """Index of the largest element (of the flattened tensor with ``axis=None``): the
        first of equal ones, or the last with ``last=True``. NaN counts as the largest."""
        if last is not False:
            return self._arg_last("argmax", x, axis, keepdims, last)
        return self.reduce("argmax", x, axis, keepdims)

    def argmin(
        self, x: Tensor, axis: int | None = None, keepdims: bool = False, *, last: bool = False
    ) -> Tensor:
        """Index of the smallest element; ``last`` as in :meth:`argmax`."""
        if last is not False:
            return self._arg_last("argmin", x, axis, keepdims, last)
        return self.reduce("argmin", x, axis, keepdims)

    def _arg_last(
        self, op: str, x: Tensor, axis: int | None, keepdims: bool, last: object
    ) -> Tensor:
        """The last occurrence: the first one of ``x`` reversed along the axis (along every
        axis for ``axis=None``, which reverses the flattened order), counted from the end."""
        if last is not True:
            raise InvalidArgumentError(f"{op}: last must be a bool; got {last!r}")
        check_tensor(self.backend, x)
        if x.ndim == 0:  # one element: its index, 0 (axis 0 or -1, as reduce takes them)
            return self.reduce(op, x, axis, keepdims)
        if axis is not None and not isinstance(axis, int):
            raise InvalidArgumentError(f"{op} takes one axis or None; got {axis!r}")
        axes = tuple(range(x.ndim)) if axis is None else (check_axis(axis, x.ndim),)
        if any(x._shape[a] == 0 for a in axes):
            raise InvalidArgumentError(
                f"{op} of an empty axis is undefined; x has shape {x._shape}"
            )
        n = x._size if axis is None else x._shape[axes[0]]
        ops = self._ops()
        first = self.reduce(op, ops.flip(x, None if axis is None else axes[0]), axis, keepdims)
        return ops.sub(n - 1, first)

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps
