"""Shape operations: reshape transpose permute concat split stack narrow gather scatter.

``reshape`` returns a view sharing the buffer; every other op writes a new dense tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

from accelkit._core.shapes import prod
from accelkit._core.validation import (
    check_axis,
    check_dim,
    check_index,
    check_int,
    check_scalar,
    check_tensor,
    check_tensors,
    is_live_tensor,
)
from accelkit.dtype import scalar_result_type
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.ops._mixins.elementwise import check_int_scalar
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

__all__ = ["ShapeOps"]

_INT = {int}
#: ``list(range(n))`` for the ranks a permutation is checked against without a call.
_RANGES = [list(range(n)) for n in range(9)]


class ShapeOps(OpsBase[TensorKernels]):
    def reshape(self, x: Tensor, shape: Sequence[int] | int) -> Tensor:
        """Same elements, new shape (one dimension may be -1); shares ``x``'s buffer."""
        if (
            type(shape) is tuple
            and shape
            and is_live_tensor(self.backend, x)
            and {*map(type, shape)} == _INT
            and min(shape) >= 0
            and prod(shape) == x._size
        ):
            # The common case in C calls: a live tensor of this backend and a tuple of
            # non-negative ints (no -1) with its element count; the path below agrees.
            return self._view(x, shape)
        check_tensor(self.backend, x)
        if isinstance(shape, int) and not isinstance(shape, bool):
            dims = [shape]
        elif isinstance(shape, Sequence) and not isinstance(shape, str):
            dims = list(shape)
        else:
            raise InvalidArgumentError(
                f"reshape: shape must be an int or a sequence of ints; got {type(shape).__name__}"
            )
        dims = [check_int(d, f"shape[{i}]", minimum=-1) for i, d in enumerate(dims)]
        if dims.count(-1) > 1:
            raise InvalidArgumentError(f"reshape: at most one -1 in shape; got {tuple(dims)}")
        if -1 in dims:
            known = prod(tuple(d for d in dims if d != -1))
            if known == 0 or x._size % known:
                raise InvalidArgumentError(
                    f"reshape: cannot infer -1 in {tuple(dims)} for {x._size} elements"
                )
            dims[dims.index(-1)] = x._size // known
        new = tuple(dims)
        if prod(new) != x._size:
            raise InvalidArgumentError(
                f"reshape: {x._shape} has {x._size} elements; {new} has {prod(new)}"
            )
        return self._view(x, new)

    def permute(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        """Reorder the axes: output axis i is input axis ``dims[i]``."""
        if type(dims) is tuple and is_live_tensor(self.backend, x):
            # The common case in C calls: a live tensor of this backend and a tuple of its
            # axes, each once, as non-negative ints; the path below agrees.
            shape = x._shape
            n = len(shape)
            if (
                0 < n == len(dims)
                and n < len(_RANGES)
                and sorted(dims) == _RANGES[n]
                and {*map(type, dims)} == _INT
            ):
                out = self._empty(tuple([shape[a] for a in dims]), x._dtype)
                self.kernels.permute(x, dims, out)
                return out
        check_tensor(self.backend, x)
        if not isinstance(dims, Sequence) or len(dims) != x.ndim:
            raise InvalidArgumentError(
                f"permute: dims must list all {x.ndim} axes of shape {x._shape}; got {dims!r}"
            )
        axes = tuple(check_axis(d, x.ndim, "dims") for d in dims)
        if sorted(axes) != list(range(x.ndim)):
            raise InvalidArgumentError(f"permute: dims {tuple(dims)} is not a permutation")
        out = self._empty(tuple(x._shape[a] for a in axes), x._dtype)
        self.kernels.permute(x, axes, out)
        return out

    def transpose(self, x: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
        """Swap two axes (by default the last two: the matrix transpose)."""
        check_tensor(self.backend, x)
        if x.ndim < 2:
            raise InvalidArgumentError(f"transpose needs at least 2 dimensions; got {x._shape}")
        a, b = check_axis(dim0, x.ndim, "dim0"), check_axis(dim1, x.ndim, "dim1")
        axes = list(range(x.ndim))
        axes[a], axes[b] = axes[b], axes[a]
        return self.permute(x, axes)

    def concat(self, tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
        """Join along an existing axis; all other dimensions and the dtype must match."""
        ts = check_tensors(self.backend, tensors, "tensors")
        first = ts[0]
        ax = check_dim(axis, first.ndim, "concat")
        for i, t in enumerate(ts[1:], 1):
            if t._dtype is not first._dtype:
                raise InvalidArgumentError(
                    f"concat: tensors[{i}] is {t._dtype.value}, tensors[0] is {first._dtype.value}"
                )
            if t.ndim != first.ndim or any(
                d != e
                for j, (d, e) in enumerate(zip(t._shape, first._shape, strict=True))
                if j != ax
            ):
                raise InvalidArgumentError(
                    f"concat along axis {ax}: tensors[{i}] has shape {t._shape}, tensors[0] has"
                    f" {first._shape}; all dimensions but the axis must match"
                )
        shape = list(first._shape)
        shape[ax] = sum(t._shape[ax] for t in ts)
        out = self._empty(tuple(shape), first._dtype)
        self.kernels.concat(ts, ax, out)
        return out

    def stack(self, tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
        """Join along a new axis; all shapes and dtypes must match."""
        ts = check_tensors(self.backend, tensors, "tensors")
        first = ts[0]
        ax = check_axis(axis, first.ndim + 1)
        for i, t in enumerate(ts[1:], 1):
            if t._shape != first._shape:
                raise InvalidArgumentError(
                    f"stack: tensors[{i}] has shape {t._shape}, tensors[0] has {first._shape}"
                )
        expanded = [self.reshape(t, (*t._shape[:ax], 1, *t._shape[ax:])) for t in ts]
        return self.concat(expanded, ax)

    def narrow(self, x: Tensor, axis: int, start: int, length: int, step: int = 1) -> Tensor:
        """``length`` elements along ``axis`` from ``start`` on, every ``step``-th (a copy):
        ``start, start+step, ..., start+(length-1)*step``. A negative ``start`` counts from
        the end; a negative ``step`` walks backwards (``narrow(x, 0, -1, n, -1)`` reverses)."""
        check_tensor(self.backend, x)
        ax = check_dim(axis, x.ndim, "narrow")
        start = check_int(start, "start")
        length = check_int(length, "length", minimum=0)
        step = check_int(step, "step")
        dim = x._shape[ax]
        if start < 0:
            start += dim
        if step != 1:
            if step == 0:
                raise InvalidArgumentError("narrow: step must not be 0")
            last = start + (length - 1) * step
            if length and not (0 <= start < dim and 0 <= last < dim):
                raise InvalidArgumentError(
                    f"narrow: indices {start}, {start + step}, ..., {last} leave axis {ax} of"
                    f" size {dim}"
                )
            index = range(start, start + length * step, step)
            return self._take(x, ax, index)  # type: ignore[attr-defined,no-any-return]
        if not 0 <= start <= dim or start + length > dim:
            raise InvalidArgumentError(
                f"narrow: [{start}, {start + length}) is outside axis {ax} of size {dim}"
            )
        shape = list(x._shape)
        shape[ax] = length
        out = self._empty(tuple(shape), x._dtype)
        self.kernels.narrow(x, ax, start, out)
        return out

    def split(self, x: Tensor, sections: int | Sequence[int], axis: int = 0) -> list[Tensor]:
        """Split into ``sections`` equal parts, or into parts of the listed sizes."""
        check_tensor(self.backend, x)
        ax = check_dim(axis, x.ndim, "split")
        dim = x._shape[ax]
        if isinstance(sections, int) and not isinstance(sections, bool):
            n = check_int(sections, "sections", minimum=1)
            if dim % n:
                raise InvalidArgumentError(
                    f"split: axis {ax} of size {dim} does not divide into {n} equal sections"
                )
            sizes = [dim // n] * n
        elif isinstance(sections, Sequence) and not isinstance(sections, str):
            parts_in: Sequence[int] = sections
            sizes = [check_int(s, f"sections[{i}]", minimum=0) for i, s in enumerate(parts_in)]
            if sum(sizes) != dim:
                raise InvalidArgumentError(
                    f"split: sizes {sizes} add up to {sum(sizes)}, axis {ax} has {dim}"
                )
        else:
            raise InvalidArgumentError(
                "split: sections must be an int or a sequence of ints; got"
                f" {type(sections).__name__}"
            )
        parts, start = [], 0
        for size in sizes:
            parts.append(self.narrow(x, ax, start, size))
            start += size
        return parts

    def gather(self, x: Tensor, axis: int, index: Tensor) -> Tensor:
        """``out[i][j][k] = x[index[i][j][k]][j][k]`` for axis 0 (PyTorch's gather).

        ``index`` has x's rank and dimensions no larger than x's off the axis. An index out of
        range is reported (InvalidArgumentError) when the result is awaited.
        """
        check_tensor(self.backend, x)
        check_tensor(self.backend, index, "index")
        check_index(index, "gather", "index")
        ax = check_dim(axis, x.ndim, "gather")
        self._check_index_shape("gather", x, index, ax)
        out = self._empty(index._shape, x._dtype)
        self.kernels.gather(x, ax, index, out)
        return out

    def scatter(
        self,
        x: Tensor,
        axis: int,
        index: Tensor,
        src: Tensor | int | float,
        reduce: str | None = None,
    ) -> Tensor:
        """A copy of ``x`` with ``out[index[i][j]][j] = src[i][j]`` for axis 0 (PyTorch's
        out-of-place scatter). Duplicate indices keep the last write in index order (the
        highest position along ``axis``), on every backend.

        ``reduce`` (``"add"``, ``"multiply"``, ``"max"``, ``"min"``) combines instead: each
        element of the result is ``x``'s value reduced with every ``src`` value that lands on
        it (PyTorch's ``scatter_reduce`` with ``include_self=True``); NaN propagates through
        max and min. Bool tensors take no reduction."""
        if reduce is not None:
            return self._scatter_reduce(x, axis, index, src, reduce)  # type: ignore[attr-defined,no-any-return]
        check_tensor(self.backend, x)
        check_tensor(self.backend, index, "index")
        check_index(index, "scatter", "index")
        ax = check_dim(axis, x.ndim, "scatter")
        self._check_index_shape("scatter", x, index, ax)
        if isinstance(src, Tensor):
            check_tensor(self.backend, src, "src")
            if src._dtype is not x._dtype:  # as with reduce= (OpenCL read src's bits as x's)
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
        out = self._empty(x._shape, x._dtype)
        self.kernels.scatter(x, ax, index, src, out)
        return out

    @staticmethod
    def _check_index_shape(op: str, x: Tensor, index: Tensor, ax: int) -> None:
        if index.ndim != x.ndim or any(
            i > d for j, (i, d) in enumerate(zip(index._shape, x._shape, strict=True)) if j != ax
        ):
            raise InvalidArgumentError(
                f"{op}: index {index._shape} must have x's rank ({x.ndim}) and no dimension larger"
                f" than x {x._shape} except along axis {ax}"
            )
