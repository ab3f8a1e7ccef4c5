"""Scans and sorting: cumsum, cumprod, sort, argsort, topk.

Validated here once. A backend with the optional ``cumulative`` and ``argsort`` kernels runs
them whole; elsewhere they are compositions of other TensorOps that run on the device:

- a scan is Hillis and Steele's: ``log2(n)`` steps of ``y = y op shift(y, 2**k)``, exact for
  integers (wrapping as a sequential loop would), within a few ulps of the sequential sum for
  floats;
- a sort is a bitonic network (``log2(n)**2 / 2`` compare-exchange steps) over (key, index)
  pairs, which makes it stable; the row is padded to a power of two with elements that sort
  last.

Order: NaN sorts as larger than every number (last ascending, first descending); ties keep
their original order in both directions (a stable sort).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from accelkit._core.validation import check_axis, check_int, check_tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["ScanOps", "scan_dtype"]

_UNSIGNED = (DType.U8, DType.U16, DType.U32, DType.U64)


def scan_dtype(dtype: DType) -> DType:
    """cumsum/cumprod's result: integers and bools give I64 (U64 for unsigned), as ``sum``."""
    if dtype.is_floating:
        return dtype
    return DType.U64 if dtype in _UNSIGNED else DType.I64


class ScanOps(OpsBase[TensorKernels]):
    """The scan and sort ops (see the module docstring)."""

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps

    # -- scans ------------------------------------------------------------------------------------
    def cumsum(
        self, x: Tensor, axis: int, *, exclusive: bool = False, reverse: bool = False
    ) -> Tensor:
        """Running sums along ``axis``. ``exclusive`` leaves each element out of its own sum
        (the first is 0); ``reverse`` runs from the end. Integers and bools give I64 (U64 for
        unsigned) and wrap on overflow; F16/BF16 accumulate in F32."""
        return self._scan("sum", x, axis, exclusive, reverse)

    def cumprod(
        self, x: Tensor, axis: int, *, exclusive: bool = False, reverse: bool = False
    ) -> Tensor:
        """Running products along ``axis`` (the exclusive form starts at 1); dtypes as
        :meth:`cumsum`."""
        return self._scan("prod", x, axis, exclusive, reverse)

    def _scan(self, op: str, x: Tensor, axis: int, exclusive: bool, reverse: bool) -> Tensor:
        name = "cumsum" if op == "sum" else "cumprod"
        check_tensor(self.backend, x)
        if x.ndim == 0:
            raise InvalidArgumentError(f"{name} needs at least 1 dimension; got a scalar")
        ax = check_axis(axis, x.ndim)
        for flag, v in (("exclusive", exclusive), ("reverse", reverse)):
            if not isinstance(v, bool):
                raise InvalidArgumentError(f"{name}: {flag} must be a bool; got {v!r}")
        dt = scan_dtype(x._dtype)
        if self.kernels.overrides("cumulative"):
            out = self._empty(x._shape, dt)
            self.kernels.cumulative(op, x, ax, exclusive, reverse, out)
            return out
        ops = self._ops()
        acc = DType.F32 if dt in (DType.F16, DType.BF16) else dt
        y = x if x._dtype is acc else ops.cast(x, acc)
        n = x._shape[ax]
        if n == 0 or x._size == 0:  # nothing to compute: an empty result of the scan's dtype
            return self._empty(x._shape, dt)  # (F16/BF16 came back as the F32 accumulator's)
        if reverse:
            y = ops.flip(y, ax)
        identity = 0 if op == "sum" else 1
        binary = "add" if op == "sum" else "mul"
        span = 1
        while span < n:
            y = ops.binary(binary, y, self._shifted(y, ax, span, identity))
            span *= 2
        if exclusive:
            y = self._shifted(y, ax, 1, identity)
        if reverse:
            y = ops.flip(y, ax)
        return y if y._dtype is dt else ops.cast(y, dt)

    def _shifted(self, y: Tensor, axis: int, by: int, fill: int) -> Tensor:
        """``y`` moved ``by`` places up ``axis``, the first ``by`` filled with ``fill``."""
        ops = self._ops()
        n = y._shape[axis]
        shape = list(y._shape)
        shape[axis] = min(by, n)
        head = self.backend.tensor_factory.full(tuple(shape), fill, y._dtype)
        if by >= n:
            return head
        return ops.concat([head, ops.narrow(y, axis, 0, n - by)], axis)

    def _all_true(self) -> Tensor:
        return self.backend.tensor_factory.full((), True, DType.BOOL)

    # -- sorting ----------------------------------------------------------------------------------
    def argsort(self, x: Tensor, axis: int = -1, *, descending: bool = False) -> Tensor:
        """I64 indices that sort ``x`` along ``axis``, stably (see the module docstring for
        the order of NaN and ties)."""
        return self._argsort(x, axis, descending, "argsort")

    def sort(self, x: Tensor, axis: int = -1, *, descending: bool = False) -> Tensor:
        """``x`` sorted along ``axis`` (stable; NaN last ascending, first descending)."""
        check_tensor(self.backend, x)
        idx = self._argsort(x, axis, descending, "sort")
        return self._ops().gather(x, check_axis(axis, x.ndim), idx)

    def topk(
        self, x: Tensor, k: int, axis: int = -1, *, largest: bool = True, sorted: bool = True
    ) -> tuple[Tensor, Tensor]:
        """The ``k`` largest (or smallest) elements along ``axis`` and their I64 indices, in
        sorted order (``sorted=False`` is accepted and gives the same order). Of equal
        elements the first in ``x`` comes first; NaN counts as the largest."""
        check_tensor(self.backend, x)
        if x.ndim == 0:
            raise InvalidArgumentError("topk needs at least 1 dimension; got a scalar")
        ax = check_axis(axis, x.ndim)
        k = check_int(k, "k", minimum=0)
        if k > x._shape[ax]:
            raise InvalidArgumentError(
                f"topk: k={k} is more than the {x._shape[ax]} elements along axis {ax}"
            )
        if not isinstance(largest, bool) or not isinstance(sorted, bool):
            raise InvalidArgumentError("topk: largest and sorted must be bools")
        ops = self._ops()
        idx = ops.narrow(self._argsort(x, ax, largest, "topk"), ax, 0, k)
        return ops.gather(x, ax, idx), idx

    def _argsort(self, x: Tensor, axis: int, descending: bool, op: str) -> Tensor:
        check_tensor(self.backend, x)
        if x.ndim == 0:
            raise InvalidArgumentError(f"{op} needs at least 1 dimension; got a scalar")
        ax = check_axis(axis, x.ndim)
        if not isinstance(descending, bool):
            raise InvalidArgumentError(f"{op}: descending must be a bool; got {descending!r}")
        if self.kernels.overrides("argsort"):
            out = self._empty(x._shape, DType.I64)
            self.kernels.argsort(x, ax, descending, out)
            return out
        return self._bitonic_argsort(x, ax, descending)

    def _bitonic_argsort(self, x: Tensor, ax: int, descending: bool) -> Tensor:
        ops, f = self._ops(), self.backend.tensor_factory
        last = x.ndim - 1
        n = x._shape[ax]
        if x._size == 0 or n <= 1:
            return f.zeros(x._shape, DType.I64)
        order = [*range(ax), *range(ax + 1, x.ndim), ax]
        key = x if ax == last else ops.permute(x, order)
        size = 1 << (n - 1).bit_length()
        if size > n:
            pad = _pad_value(x._dtype, descending)
            key = ops.pad(key, [(0, 0)] * last + [(0, size - n)], value=pad)
        rows = key._shape[:-1]
        index = ops.broadcast_to(f.arange(size, dtype=DType.I64), (*rows, size))
        floats = x._dtype.is_floating
        positions = np.arange(size)
        width = 2
        while width <= size:
            span = width // 2
            while span:
                partner = positions ^ span
                # Element i keeps the smaller of the pair where the block runs up and i is the
                # pair's first, or the block runs down and i is its second.
                keeps_min = (positions < partner) == ((positions & width) == 0)
                p_key = self._take(key, last, partner)  # type: ignore[attr-defined]
                p_index = self._take(index, last, partner)  # type: ignore[attr-defined]
                p_first = self._before(p_key, p_index, key, index, floats, descending)
                take = ops.eq(p_first, f.from_host(keeps_min, DType.BOOL))
                key = ops.where(take, p_key, key)
                index = ops.where(take, p_index, index)
                span //= 2
            width *= 2
        if size > n:
            index = ops.narrow(index, last, 0, n)
        if ax != last:
            index = ops.permute(index, [int(a) for a in np.argsort(order)])
        return index

    def _before(
        self, a: Tensor, ai: Tensor, b: Tensor, bi: Tensor, floats: bool, descending: bool
    ) -> Tensor:
        """Whether (a, ai) sorts before (b, bi): by key (NaN largest), then by index."""
        ops = self._ops()
        first = ops.gt(a, b) if descending else ops.lt(a, b)
        tie = ops.eq(a, b)
        if floats:
            a_nan, b_nan = ops.ne(a, a), ops.ne(b, b)
            nan_first = (
                ops.bitwise_and(a_nan, ops.bitwise_not(b_nan))
                if descending
                else ops.bitwise_and(b_nan, ops.bitwise_not(a_nan))
            )
            first = ops.bitwise_or(first, nan_first)
            tie = ops.bitwise_or(tie, ops.bitwise_and(a_nan, b_nan))
        return ops.bitwise_or(first, ops.bitwise_and(tie, ops.lt(ai, bi)))


def _pad_value(dtype: DType, descending: bool) -> int | float | bool:
    """A value that sorts after every element once ties go by index (pads have the largest
    indices): NaN ascending and -inf descending for floats, the extreme integer otherwise."""
    if dtype is DType.BOOL:
        return not descending
    if dtype.is_floating:
        return float("-inf") if descending else float("nan")
    info = np.iinfo(dtype.to_numpy())
    return int(info.min) if descending else int(info.max)
