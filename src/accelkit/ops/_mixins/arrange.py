"""Rearranging operations: pad, broadcast_to, tile, flip, strided narrow, tril/triu, one_hot.

Each is validated here once and written as an index map computed on the host from the shapes
alone (never from the data), applied on the device by the optional ``take`` kernel, or, on a
backend without one, by ``gather`` with a device-side index. Constant padding is a ``concat``
with filled tensors, tril/triu a ``where`` with a shape-derived mask, one_hot a comparison with
``arange``. Every result is a new dense tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.shapes import prod
from accelkit._core.validation import (
    check_dim,
    check_dtype,
    check_int,
    check_scalar,
    check_tensor,
)
from accelkit.dtype import DType, scalar_result_type
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase, check_result_fits
from accelkit.ops._mixins.elementwise import check_int_scalar
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["PAD_MODES", "ArrangeOps"]

#: ``pad`` modes: ``constant`` fills with ``value``; the others are NumPy's ``np.pad`` modes.
PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def _int_list(value: object, name: str, op: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [check_int(v, f"{name}[{i}]") for i, v in enumerate(value)]
    raise InvalidArgumentError(
        f"{op}: {name} must be an int or a sequence of ints; got {type(value).__name__}"
    )


class ArrangeOps(OpsBase[TensorKernels]):
    """The rearranging ops (see the module docstring)."""

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps

    # -- the one primitive ------------------------------------------------------------------------
    def _take(self, x: Tensor, axis: int, index: np.ndarray[Any, Any] | range) -> Tensor:
        """``np.take(x, index, axis)`` for a host index (1-d, every value in range; a ``range``
        for an evenly spaced one, which a kernel may turn into a strided copy)."""
        shape = list(x._shape)
        shape[axis] = len(index)
        out_shape = tuple(shape)
        if self.kernels.overrides("take"):
            out = self._empty(out_shape, x._dtype)
            given = index if isinstance(index, range) else np.ascontiguousarray(index, np.int64)
            self.kernels.take(x, axis, given, out)
            return out
        idx = np.asarray(index, dtype=np.int64)
        ops = self._ops()
        f = self.backend.tensor_factory
        if prod(out_shape) == 0:
            return f.empty(out_shape, x._dtype)
        line = [1] * x.ndim
        line[axis] = len(idx)
        # The index broadcast to the output's shape on the device: where() copies it along the
        # other axes, and gather reads x through it.
        small = f.from_host(idx.reshape(line), DType.I64)
        full = ops.where(f.full(out_shape, True, DType.BOOL), small, small)
        return ops.gather(x, axis, full)

    # -- public ops -------------------------------------------------------------------------------
    def flip(self, x: Tensor, axis: int | Sequence[int] | None = None) -> Tensor:
        """Reverse the order of elements along ``axis`` (an int, several, or all with None)."""
        check_tensor(self.backend, x)
        if axis is None:
            axes = list(range(x.ndim))
        else:
            axes = [check_dim(a, x.ndim, "flip") for a in _int_list(axis, "axis", "flip")]
            if len(set(axes)) != len(axes):
                raise InvalidArgumentError(f"flip: axis {axis!r} repeats an axis")
        y = x
        for a in axes:
            y = self._take(y, a, range(x._shape[a] - 1, -1, -1))
        return y if y is not x else self._ops().where(self._true(), x, x)

    def broadcast_to(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """``x`` repeated to ``shape`` by NumPy's broadcasting rules (a new tensor)."""
        check_tensor(self.backend, x)
        target = tuple(_int_list(shape, "shape", "broadcast_to"))
        if any(d < 0 for d in target):
            raise InvalidArgumentError(f"broadcast_to: shape {target} has a negative dimension")
        lead = len(target) - x.ndim
        if lead < 0 or any(d not in (1, t) for d, t in zip(x._shape, target[lead:], strict=True)):
            raise InvalidArgumentError(
                f"broadcast_to: shape {x._shape} does not broadcast to {target}"
            )
        check_result_fits(self.backend, "broadcast_to", target, x._dtype)
        y = self._ops().reshape(x, (1,) * lead + x._shape) if lead else x
        for a, (d, t) in enumerate(zip(y._shape, target, strict=True)):
            if d != t:
                y = self._take(y, a, np.zeros(t, np.int64))
        return y if y is not x else self._ops().where(self._true(), x, x)

    def tile(self, x: Tensor, reps: int | Sequence[int]) -> Tensor:
        """``x`` repeated ``reps`` times along each axis (NumPy's ``tile``: a shorter ``reps``
        is padded with ones in front, a longer one adds leading axes to ``x``)."""
        check_tensor(self.backend, x)
        r = _int_list(reps, "reps", "tile")
        if any(v < 0 for v in r):
            raise InvalidArgumentError(f"tile: reps {tuple(r)} has a negative count")
        nd = max(len(r), x.ndim)
        r = [1] * (nd - len(r)) + r
        full = (1,) * (nd - x.ndim) + x._shape
        check_result_fits(
            self.backend, "tile", tuple(d * c for d, c in zip(full, r, strict=True)), x._dtype
        )
        y = self._ops().reshape(x, full) if nd > x.ndim else x
        for a, count in enumerate(r):
            if count != 1:
                y = self._take(y, a, np.tile(np.arange(y._shape[a]), count))
        return y if y is not x else self._ops().where(self._true(), x, x)

    def pad(
        self,
        x: Tensor,
        pad_width: int | Sequence[int] | Sequence[Sequence[int]],
        mode: str = "constant",
        value: int | float | bool = 0,
    ) -> Tensor:
        """Pad every axis by ``(before, after)`` elements (NumPy's ``np.pad``).

        ``pad_width`` is one int for every side, one ``(before, after)`` pair for every axis, or
        a pair per axis. ``mode``: ``constant`` (filled with ``value``), ``edge`` (the border
        element repeated), ``reflect`` (mirrored without the border), ``symmetric`` (mirrored
        with it) or ``wrap`` (periodic).
        """
        check_tensor(self.backend, x)
        if mode not in PAD_MODES:
            raise InvalidArgumentError(
                f"pad: unknown mode {mode!r}; expected one of: {', '.join(PAD_MODES)}"
            )
        widths = self._pad_widths(x, pad_width)
        if mode == "constant":
            check_scalar(value, "value")
            if scalar_result_type(x._dtype, value) is not x._dtype:
                raise InvalidArgumentError(
                    f"pad: a {type(value).__name__} value does not fit a {x._dtype.value} tensor"
                )
            check_int_scalar("pad", "value", value, x._dtype)
        else:
            for a, (before, after) in enumerate(widths):
                if (before or after) and x._shape[a] == 0:
                    raise InvalidArgumentError(
                        f"pad: mode {mode!r} cannot pad axis {a}, which is empty"
                    )
        padded = tuple(d + b + e for d, (b, e) in zip(x._shape, widths, strict=True))
        check_result_fits(self.backend, "pad", padded, x._dtype)
        ops, f = self._ops(), self.backend.tensor_factory
        y = x
        for a, (before, after) in enumerate(widths):
            if not (before or after):
                continue
            if mode == "constant":
                parts = []
                for n in (before, None, after):
                    if n is None:
                        parts.append(y)
                    elif n:
                        shape = list(y._shape)
                        shape[a] = n
                        parts.append(f.full(tuple(shape), value, x._dtype))
                y = ops.concat(parts, a)
            else:
                index = np.pad(np.arange(y._shape[a]), (before, after), mode=mode)  # type: ignore[call-overload]
                y = self._take(y, a, index)
        return y if y is not x else ops.where(self._true(), x, x)

    def tril(self, x: Tensor, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two axes: elements with ``col - row <= diagonal``
        kept, the rest zero."""
        return self._triangle(x, diagonal, lower=True)

    def triu(self, x: Tensor, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two axes: elements with ``col - row >= diagonal``
        kept, the rest zero."""
        return self._triangle(x, diagonal, lower=False)

    def one_hot(self, indices: Tensor, num_classes: int, dtype: DType | str = DType.I64) -> Tensor:
        """``[..., num_classes]`` with a one at each index (PyTorch's ``one_hot``; its default
        I64 result). ``num_classes`` is required: inferring it would need the data on the host.
        An index outside ``0..num_classes-1`` is reported when the result is awaited."""
        check_tensor(self.backend, indices, "indices")
        if not indices._dtype.is_integer:
            raise InvalidArgumentError(
                f"one_hot: indices must be an integer tensor; got {indices._dtype.value}"
            )
        n = check_int(num_classes, "num_classes", minimum=1)
        dt = check_dtype(self.backend, dtype)
        check_result_fits(self.backend, "one_hot", (*indices._shape, n), DType.I64)
        ops, f = self._ops(), self.backend.tensor_factory
        classes = f.arange(n, dtype=DType.I64)
        # embedding() of the [n, 1] table of class numbers is each index itself, checked for
        # range, with a trailing axis that broadcasts against the classes.
        checked = ops.embedding(indices, ops.reshape(classes, (n, 1)))
        hot = ops.eq(checked, classes)
        return hot if dt is DType.BOOL else ops.cast(hot, dt)

    # -- helpers ----------------------------------------------------------------------------------
    def _true(self) -> Tensor:
        return self.backend.tensor_factory.full((), True, DType.BOOL)

    @staticmethod
    def _pad_widths(x: Tensor, pad_width: object) -> list[tuple[int, int]]:
        bad = InvalidArgumentError(
            "pad: pad_width must be an int, a (before, after) pair, or one pair per axis of"
            f" {x._shape}; got {pad_width!r}"
        )
        if isinstance(pad_width, int) and not isinstance(pad_width, bool):
            pairs = [(pad_width, pad_width)] * x.ndim
        elif isinstance(pad_width, Sequence) and not isinstance(pad_width, str):
            items = list(pad_width)
            if len(items) == 2 and all(isinstance(v, int) for v in items):
                pairs = [(items[0], items[1])] * x.ndim
            elif len(items) == x.ndim and all(
                isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2 for p in items
            ):
                pairs = [(p[0], p[1]) for p in items]
            else:
                raise bad
        else:
            raise bad
        return [
            (
                check_int(b, f"pad_width[{a}][0]", minimum=0),
                check_int(e, f"pad_width[{a}][1]", minimum=0),
            )
            for a, (b, e) in enumerate(pairs)
        ]

    def _triangle(self, x: Tensor, diagonal: int, *, lower: bool) -> Tensor:
        op = "tril" if lower else "triu"
        check_tensor(self.backend, x)
        if x.ndim < 2:
            raise InvalidArgumentError(f"{op} needs at least 2 dimensions; got {x._shape}")
        k = check_int(diagonal, "diagonal")
        rows, cols = x._shape[-2:]
        k = max(-rows - 1, min(k, cols + 1))  # beyond the matrix every offset is the same
        keep = (
            np.tri(rows, cols, k, dtype=bool) if lower else ~np.tri(rows, cols, k - 1, dtype=bool)
        )
        mask = self.backend.tensor_factory.from_host(keep, DType.BOOL)
        zero: int | bool = False if x._dtype is DType.BOOL else 0
        return self._ops().where(mask, x, zero)
