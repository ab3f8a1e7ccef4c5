"""Indexing beyond gather/scatter: scatter with a reduction, index_add, gather_nd, scatter_nd.

Validated here once. A reduction runs the backend's optional ``scatter_reduce`` kernel (the CPU
and OpenCL backends have one; each walks duplicates in index order, so results are the same on
every run); elsewhere the core composes it on the device from a comparison of every index with
every destination (``O(index size x axis length)`` memory), which is deterministic too. The
``_nd`` forms flatten the leading axes they index and reuse ``embedding`` (which checks every
index against its range) and ``scatter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from accelkit._core.shapes import prod
from accelkit._core.validation import check_dim, check_index, check_scalar, check_tensor
from accelkit.dtype import DType, scalar_result_type
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.ops._mixins.elementwise import check_int_scalar
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["SCATTER_REDUCTIONS", "IndexingOps"]

#: ``scatter(..., reduce=)`` values.
SCATTER_REDUCTIONS = ("add", "multiply", "max", "min")
_BINARY = {"add": "add", "multiply": "mul", "max": "maximum", "min": "minimum"}
_REDUCE = {"add": "sum", "multiply": "prod", "max": "max", "min": "min"}


class IndexingOps(OpsBase[TensorKernels]):
    """Indexed reductions and N-d gathers and scatters (see the module docstring)."""

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps

    def _scatter_reduce(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, reduce: str
    ) -> Tensor:
        if reduce not in SCATTER_REDUCTIONS:
            raise InvalidArgumentError(
                f"scatter: reduce must be one of {', '.join(SCATTER_REDUCTIONS)} or None; got"
                f" {reduce!r}"
            )
        b = self.backend
        check_tensor(b, x)
        check_tensor(b, index, "index")
        check_index(index, "scatter", "index")
        if x._dtype is DType.BOOL:
            raise InvalidArgumentError(
                f"scatter: reduce={reduce!r} takes no bool tensor; cast first"
            )
        ax = check_dim(axis, x.ndim, "scatter")
        self._check_index_shape("scatter", x, index, ax)  # type: ignore[attr-defined]
        if isinstance(src, Tensor):
            check_tensor(b, src, "src")
            if src._dtype is not x._dtype:
                raise InvalidArgumentError(
                    f"scatter: src is {src._dtype.value}, x is {x._dtype.value}; cast one"
                )
            if src.ndim != index.ndim or any(
                s < i for s, i in zip(src._shape, index._shape, strict=True)
            ):
                raise InvalidArgumentError(
                    f"scatter: src {src._shape} must have index's rank and be at least as large as"
                    f" index {index._shape}"
                )
        else:
            check_scalar(src, "src")
            if scalar_result_type(x._dtype, src) is not x._dtype:
                raise InvalidArgumentError(
                    f"scatter: a {type(src).__name__} src does not fit a {x._dtype.value} tensor"
                )
            check_int_scalar("scatter", "src", src, x._dtype)
        if self.kernels.overrides("scatter_reduce"):
            out = self._empty(x._shape, x._dtype)
            self.kernels.scatter_reduce(reduce, x, ax, index, src, out)
            return out
        return self._scatter_reduce_composed(x, ax, index, src, reduce)

    def _scatter_reduce_composed(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, reduce: str
    ) -> Tensor:
        """Per destination ``j`` along ``axis``: the reduction of the ``src`` values whose index
        is ``j`` (a ``where`` over the comparison of every index with every destination, so
        NaN stays with its destination), combined with ``x``'s value."""
        ops, f = self._ops(), self.backend.tensor_factory
        if index._size == 0:
            return ops.where(f.full((), True, DType.BOOL), x, x)
        m, dim = index._shape[axis], x._shape[axis]
        # The index and src padded to x's shape off the axis with an index that matches nothing.
        if index._dtype.is_signed:
            idx = ops.cast(index, DType.I64) if index._dtype is not DType.I64 else index
            idx = ops.where(ops.lt(idx, 0), ops.add(idx, dim), idx)
        else:  # no negative indices: a U64 from 2**63 on wrapped to one, and was taken as such
            idx = ops.cast(ops.minimum(index, dim), DType.I64)  # beyond the axis: reported as dim
        idx = self._checked(idx, dim)
        widths = [(0, 0 if a == axis else x._shape[a] - index._shape[a]) for a in range(x.ndim)]
        if any(after for _, after in widths):
            idx = ops.pad(idx, widths, value=-1)
        if isinstance(src, Tensor):
            values = src
            if src._shape != index._shape:
                values = self._corner(src, index)
            if any(after for _, after in widths):
                values = ops.pad(values, widths)
        else:
            shape = tuple(m if a == axis else x._shape[a] for a in range(x.ndim))
            values = f.full(shape, src, x._dtype)
        # match[..., i, ..., j, ...]: index i lands on destination j (a new last axis holds j).
        dest = f.arange(dim, dtype=DType.I64)
        match = ops.eq(ops.reshape(idx, (*idx._shape, 1)), dest)
        spread = ops.reshape(values, (*values._shape, 1))
        identity = _identity(reduce, x._dtype)
        picked = ops.where(match, spread, identity)
        combined = ops.reduce(_REDUCE[reduce], picked, axis)  # [..., j-axis last]
        if combined._dtype is not x._dtype:
            combined = ops.cast(combined, x._dtype)
        order = [*range(axis), x.ndim - 1, *range(axis, x.ndim - 1)]
        combined = ops.permute(combined, order)
        return ops.binary(_BINARY[reduce], x, combined)

    def _corner(self, src: Tensor, index: Tensor) -> Tensor:
        ops = self._ops()
        y = src
        for a, size in enumerate(index._shape):
            if y._shape[a] != size:
                y = ops.narrow(y, a, 0, size)
        return y

    def _checked(self, idx: Tensor, dim: int) -> Tensor:
        """``idx`` (I64) passed through ``embedding`` of the numbers ``0..dim-1``: the same
        values, with any outside that range reported when a result depending on them is
        awaited."""
        ops, f = self._ops(), self.backend.tensor_factory
        table = ops.reshape(f.arange(dim, dtype=DType.I64), (dim, 1))
        return ops.reshape(ops.embedding(ops.reshape(idx, (idx._size,)), table), idx._shape)

    def index_add(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor, alpha: int | float = 1
    ) -> Tensor:
        """A copy of ``x`` with ``alpha * src[..., i, ...]`` added to ``x[..., index[i], ...]``
        along ``axis`` (PyTorch's ``index_add``): ``index`` is 1-d, ``src`` has x's shape but
        ``len(index)`` along the axis. Duplicate indices add up (in index order)."""
        b = self.backend
        check_tensor(b, x)
        check_tensor(b, index, "index")
        check_tensor(b, src, "src")
        check_index(index, "index_add", "index")
        ax = check_dim(axis, x.ndim, "index_add")
        if index.ndim != 1:
            raise InvalidArgumentError(f"index_add: index must be 1-d; got {index._shape}")
        want = tuple(index._shape[0] if a == ax else d for a, d in enumerate(x._shape))
        if src._shape != want:
            raise InvalidArgumentError(f"index_add: src must be {want}; got {src._shape}")
        check_scalar(alpha, "alpha")
        if isinstance(alpha, float) and not x._dtype.is_floating:  # as PyTorch refuses it
            raise InvalidArgumentError(
                f"index_add: alpha must be an int for the {x._dtype.name} tensor x; got {alpha!r}"
                " (the product would be truncated)"
            )
        ops = self._ops()
        if alpha != 1:
            src = ops.mul(src, alpha)
            if src._dtype is not x._dtype:
                src = ops.cast(src, x._dtype)
        line = [1] * x.ndim
        line[ax] = index._shape[0]
        full = ops.broadcast_to(ops.reshape(index, tuple(line)), want)
        return ops.scatter(x, ax, full, src, reduce="add")

    def gather_nd(self, x: Tensor, indices: Tensor) -> Tensor:
        """``out[i...] = x[indices[i..., 0], ..., indices[i..., K-1]]`` (TensorFlow's
        ``gather_nd``): ``indices`` [..., K] with ``K <= x.ndim`` picks elements (K == ndim) or
        slices of the trailing axes. Out-of-range indices (each in ``0..dim-1``) are reported
        when the result is awaited."""
        rest = self._check_nd("gather_nd", x, indices)
        lin = self._linear_index(x, indices)
        ops = self._ops()
        rows = prod(x._shape[: x.ndim - len(rest)])
        table = ops.reshape(x, (rows, prod(rest)))
        picked = ops.embedding(lin, table)
        return ops.reshape(picked, (*indices._shape[:-1], *rest))

    def scatter_nd(
        self, x: Tensor, indices: Tensor, updates: Tensor, reduce: str | None = None
    ) -> Tensor:
        """A copy of ``x`` with ``updates[i...]`` written at ``x[indices[i..., :]]`` (elements or
        trailing slices, as :meth:`gather_nd` reads them). Duplicates keep the last write in
        index order, or combine with ``reduce`` as :meth:`scatter`'s."""
        rest = self._check_nd("scatter_nd", x, indices)
        check_tensor(self.backend, updates, "updates")
        want = (*indices._shape[:-1], *rest)
        if updates._shape != want:
            raise InvalidArgumentError(f"scatter_nd: updates must be {want}; got {updates._shape}")
        if updates._dtype is not x._dtype:
            raise InvalidArgumentError(
                f"scatter_nd: updates are {updates._dtype.value}, x is {x._dtype.value}"
            )
        if reduce is not None and reduce not in SCATTER_REDUCTIONS:
            raise InvalidArgumentError(
                f"scatter_nd: reduce must be one of {', '.join(SCATTER_REDUCTIONS)} or None; got"
                f" {reduce!r}"
            )
        lin = self._linear_index(x, indices)
        ops = self._ops()
        rows, width = prod(x._shape[: x.ndim - len(rest)]), prod(rest)
        n = lin._size
        index = ops.broadcast_to(ops.reshape(lin, (n, 1)), (n, width))
        out = ops.scatter(
            ops.reshape(x, (rows, width)), 0, index, ops.reshape(updates, (n, width)), reduce
        )
        return ops.reshape(out, x._shape)

    def _check_nd(self, op: str, x: Tensor, indices: Tensor) -> tuple[int, ...]:
        """Validate; return the trailing shape each index tuple selects."""
        b = self.backend
        check_tensor(b, x)
        check_tensor(b, indices, "indices")
        check_index(indices, op, "indices")
        if indices.ndim == 0 or not 1 <= indices._shape[-1] <= x.ndim:
            raise InvalidArgumentError(
                f"{op}: indices must be [..., K] with 1 <= K <= x.ndim ({x.ndim}); got"
                f" {indices._shape}"
            )
        k = indices._shape[-1]
        if any(d == 0 for d in x._shape[:k]) and indices._size:
            raise InvalidArgumentError(f"{op}: x {x._shape} has an empty indexed axis")
        return x._shape[k:]

    def _linear_index(self, x: Tensor, indices: Tensor) -> Tensor:
        """The row number of each index tuple in ``x`` viewed as [rows, trailing elements],
        each component checked against its axis (reported when awaited)."""
        ops = self._ops()
        k = indices._shape[-1]
        n = indices._size // k
        flat = ops.reshape(indices, (n, k))
        strides = np.cumprod((1, *x._shape[1:k][::-1]))[::-1]
        lin: Tensor | None = None
        for a in range(k):
            dim = x._shape[a]
            part = ops.reshape(ops.narrow(flat, 1, a, 1), (n,))
            checked = self._checked(part, dim)
            term = ops.mul(checked, int(strides[a])) if strides[a] != 1 else checked
            lin = term if lin is None else ops.add(lin, term)
        assert lin is not None
        return lin


def _identity(reduce: str, dtype: DType) -> int | float:
    if reduce == "add":
        return 0
    if reduce == "multiply":
        return 1
    big = float("inf") if dtype.is_floating else None
    if big is None:
        info = np.iinfo(dtype.to_numpy())
        return int(info.min) if reduce == "max" else int(info.max)
    return -big if reduce == "max" else big
