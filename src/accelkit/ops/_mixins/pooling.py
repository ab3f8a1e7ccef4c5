"""Pooling and the other convolutions: max_pool2d, avg_pool2d, adaptive_avg_pool2d, conv1d,
conv_transpose2d (PyTorch's semantics).

Written once in the core as compositions of other TensorOps, on the device: average pooling is a
depthwise ``conv2d`` with a ones kernel divided by a divisor map computed from the shapes, max
pooling the ``maximum`` of strided windows of the input padded with -inf, conv1d a ``conv2d``
of height one, and the transposed convolution a ``conv2d`` of the zero-stuffed input with the
flipped, transposed weight. NaN propagates as in PyTorch: into the windows that hold it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from accelkit._core.validation import check_float, check_int, check_same_dtype, check_tensor, pair
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase, check_result_fits
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["PoolingOps", "pool_output_size"]

PairArg = int | tuple[int, int]


def pool_output_size(
    size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool
) -> int:
    """PyTorch's pooling output length; with ``ceil_mode`` the last window must start inside the
    input or its left padding."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


class PoolingOps(OpsBase[TensorKernels]):
    """Pooling, conv1d and conv_transpose2d (see the module docstring)."""

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps

    # -- pooling ----------------------------------------------------------------------------------
    def avg_pool2d(
        self,
        x: Tensor,
        kernel_size: PairArg,
        stride: PairArg | None = None,
        padding: PairArg = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> Tensor:
        """Mean over ``kernel_size`` windows of the NCHW float ``x``, every ``stride`` (default:
        the kernel size) with zero ``padding`` (at most half the kernel). ``count_include_pad``
        counts padded zeros in the divisor; ``ceil_mode`` adds a last, partial window."""
        k, s, p, _ = self._pool_args("avg_pool2d", x, kernel_size, stride, padding, 1)
        flags = (("ceil_mode", ceil_mode), ("count_include_pad", count_include_pad))
        for name, v in flags:
            if not isinstance(v, bool):
                raise InvalidArgumentError(f"avg_pool2d: {name} must be a bool; got {v!r}")
        check_float(x, "avg_pool2d")
        _, c, h, w = x._shape
        oh = pool_output_size(h, k[0], s[0], p[0], 1, ceil_mode)
        ow = pool_output_size(w, k[1], s[1], p[1], 1, ceil_mode)
        self._check_output("avg_pool2d", x, oh, ow)
        ops, f = self._ops(), self.backend.tensor_factory
        if c == 0:  # no channels: no grouped convolution to run (groups=0 is refused)
            return f.zeros((x._shape[0], 0, oh, ow), x._dtype)
        divisor = np.outer(
            _divisors(h, oh, k[0], s[0], p[0], count_include_pad),
            _divisors(w, ow, k[1], s[1], p[1], count_include_pad),
        )
        work = DType.F64 if x._dtype is DType.F64 else DType.F32
        y = x if x._dtype is work else ops.cast(x, work)
        y = self._pad_for(y, (oh, ow), k, s, p, (1, 1), 0.0)
        ones = f.ones((c, 1, k[0], k[1]), work)
        sums = ops.conv2d(y, ones, stride=s, groups=c)
        out = ops.div(sums, f.from_host(divisor, work))
        return out if out._dtype is x._dtype else ops.cast(out, x._dtype)

    def max_pool2d(
        self,
        x: Tensor,
        kernel_size: PairArg,
        stride: PairArg | None = None,
        padding: PairArg = 0,
        dilation: PairArg = 1,
        ceil_mode: bool = False,
    ) -> Tensor:
        """Maximum over ``kernel_size`` windows (spaced by ``dilation``) of the NCHW ``x`` (float
        or integer), every ``stride`` (default: the kernel size); ``padding`` (at most half the
        dilated kernel) never wins. A window holding a NaN gives NaN."""
        k, s, p, d = self._pool_args("max_pool2d", x, kernel_size, stride, padding, dilation)
        if not isinstance(ceil_mode, bool):
            raise InvalidArgumentError(f"max_pool2d: ceil_mode must be a bool; got {ceil_mode!r}")
        if x._dtype is DType.BOOL:
            raise InvalidArgumentError("max_pool2d: x is bool; cast it to an integer dtype first")
        _, _, h, w = x._shape
        oh = pool_output_size(h, k[0], s[0], p[0], d[0], ceil_mode)
        ow = pool_output_size(w, k[1], s[1], p[1], d[1], ceil_mode)
        self._check_output("max_pool2d", x, oh, ow)
        ops = self._ops()
        lowest: float | int = (
            float("-inf") if x._dtype.is_floating else int(np.iinfo(x._dtype.to_numpy()).min)
        )
        y = self._pad_for(x, (oh, ow), k, s, p, d, lowest)
        out: Tensor | None = None
        for i in range(k[0]):
            rows = ops.narrow(y, 2, i * d[0], oh, s[0])
            for j in range(k[1]):
                window = ops.narrow(rows, 3, j * d[1], ow, s[1])
                out = window if out is None else ops.maximum(out, window)
        assert out is not None  # kernel sizes are at least 1
        return out

    def adaptive_avg_pool2d(
        self, x: Tensor, output_size: int | tuple[int | None, int | None]
    ) -> Tensor:
        """Mean over ``output_size`` windows that cover the NCHW float ``x``: window ``i`` of
        ``n`` along a side of ``L`` spans ``floor(i*L/n) .. ceil((i+1)*L/n) - 1`` (PyTorch's);
        ``None`` keeps that side's size."""
        check_tensor(self.backend, x)
        check_float(x, "adaptive_avg_pool2d")
        if x.ndim != 4:
            raise InvalidArgumentError(
                f"adaptive_avg_pool2d: x must be [N, C, H, W]; got {x._shape}"
            )
        _, _, h, w = x._shape
        if isinstance(output_size, Sequence) and not isinstance(output_size, str):
            if len(output_size) != 2:
                raise InvalidArgumentError(
                    f"adaptive_avg_pool2d: output_size must be an int or a pair; got {output_size!r}"
                )
            sizes = [
                size if v is None else check_int(v, f"output_size[{i}]", minimum=1)
                for i, (v, size) in enumerate(zip(output_size, (h, w), strict=True))
            ]
        else:
            sizes = [check_int(output_size, "output_size", minimum=1)] * 2
        oh, ow = sizes
        check_result_fits(self.backend, "adaptive_avg_pool2d", (*x._shape[:2], oh, ow), x._dtype)
        if h == 0 or w == 0:
            raise InvalidArgumentError(f"adaptive_avg_pool2d: x {x._shape} has an empty side")
        if h % oh == 0 and w % ow == 0:  # equal windows: one average pooling
            return self.avg_pool2d(x, (h // oh, w // ow))
        ops = self._ops()
        work = DType.F64 if x._dtype is DType.F64 else DType.F32
        y = x if x._dtype is work else ops.cast(x, work)
        y = self._adaptive_axis(y, 2, oh)
        y = self._adaptive_axis(y, 3, ow)
        return y if y._dtype is x._dtype else ops.cast(y, x._dtype)

    def _adaptive_axis(self, y: Tensor, axis: int, n: int) -> Tensor:
        """The adaptive windows along one axis: the r-th element of every window, taken where
        the window has one (``where``, so a NaN stays in its own windows), summed and divided."""
        ops, f = self._ops(), self.backend.tensor_factory
        length = y._shape[axis]
        starts = (np.arange(n) * length) // n
        ends = -((-(np.arange(1, n + 1) * length)) // n)
        counts = ends - starts
        line = [1] * y.ndim
        line[axis] = n
        total: Tensor | None = None
        for r in range(int(counts.max())):
            part = self._take(y, axis, np.minimum(starts + r, ends - 1))  # type: ignore[attr-defined]
            if r >= int(counts.min()):
                inside = f.from_host((r < counts).reshape(line), DType.BOOL)
                part = ops.where(inside, part, 0.0)
            total = part if total is None else ops.add(total, part)
        assert total is not None
        return ops.div(total, f.from_host(counts.reshape(line).astype(np.float64), y._dtype))

    def _pool_args(
        self,
        op: str,
        x: Tensor,
        kernel_size: object,
        stride: object,
        padding: object,
        dilation: object,
    ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
        check_tensor(self.backend, x)
        if x.ndim != 4:
            raise InvalidArgumentError(f"{op}: x must be [N, C, H, W]; got {x._shape}")
        k = pair(kernel_size, "kernel_size", minimum=1)
        s = k if stride is None else pair(stride, "stride", minimum=1)
        p = pair(padding, "padding", minimum=0)
        d = pair(dilation, "dilation", minimum=1)
        for i in range(2):
            if p[i] > (d[i] * (k[i] - 1) + 1) // 2:
                raise InvalidArgumentError(
                    f"{op}: padding {p} must be at most half the (dilated) kernel {k}"
                )
        return k, s, p, d

    @staticmethod
    def _check_output(op: str, x: Tensor, oh: int, ow: int) -> None:
        if oh <= 0 or ow <= 0:
            raise InvalidArgumentError(
                f"{op}: the window does not fit the input {x._shape}; the output would be {oh}x{ow}"
            )

    def _pad_for(
        self,
        x: Tensor,
        out_hw: tuple[int, int],
        k: tuple[int, int],
        s: tuple[int, int],
        p: tuple[int, int],
        d: tuple[int, int],
        value: float | int,
    ) -> Tensor:
        """``x`` padded with ``value``: ``p`` before, and after as far as the last window
        reaches (past ``p`` in ceil mode)."""
        widths = [(0, 0), (0, 0)]
        for i in range(2):
            reach = (out_hw[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
            after = max(p[i], reach - x._shape[2 + i] - p[i])
            widths.append((p[i], after))
        if all(b == 0 and a == 0 for b, a in widths):
            return x
        return self._ops().pad(x, widths, value=value)

    # -- convolutions -----------------------------------------------------------------------------
    def conv1d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        *,
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int = 1,
        groups: int = 1,
    ) -> Tensor:
        """1-d cross-correlation: ``x`` [N, C, L], ``weight`` [O, C/groups, K], ``bias`` [O];
        zero ``padding`` an int or ``(left, right)``. Output [N, O, OL]."""
        check_tensor(self.backend, x)
        check_tensor(self.backend, weight, "weight")
        if x.ndim != 3 or weight.ndim != 3:
            raise InvalidArgumentError(
                f"conv1d: x must be [N, C, L] and weight [O, C/groups, K]; got x {x._shape} and"
                f" weight {weight._shape}"
            )
        left, right = pair(padding, "padding", minimum=0)
        stride_ = check_int(stride, "stride", minimum=1)
        dilation_ = check_int(dilation, "dilation", minimum=1)
        ops = self._ops()
        n, c, length = x._shape
        o, cg, k = weight._shape
        y = ops.conv2d(
            ops.reshape(x, (n, c, 1, length)),
            ops.reshape(weight, (o, cg, 1, k)),
            bias,
            stride=(1, stride_),
            padding=((0, 0), (left, right)),
            dilation=(1, dilation_),
            groups=groups,
        )
        return ops.reshape(y, (n, o, y._shape[3]))

    def conv_transpose2d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        *,
        stride: PairArg = 1,
        padding: PairArg = 0,
        output_padding: PairArg = 0,
        groups: int = 1,
        dilation: PairArg = 1,
    ) -> Tensor:
        """The transpose (gradient) of conv2d: ``x`` [N, C_in, H, W], ``weight`` [C_in,
        C_out/groups, KH, KW] (PyTorch's layout), ``bias`` [C_out]. Output side
        ``(H-1)*stride - 2*padding + dilation*(KH-1) + output_padding + 1``;
        ``output_padding`` must be smaller than the stride or the dilation."""
        b = self.backend
        check_tensor(b, x)
        check_tensor(b, weight, "weight")
        check_float(x, "conv_transpose2d")
        check_same_dtype("conv_transpose2d", x=x, weight=weight, bias=bias)
        if x.ndim != 4 or weight.ndim != 4:
            raise InvalidArgumentError(
                f"conv_transpose2d: x must be [N, C_in, H, W] and weight [C_in, C_out/groups, KH,"
                f" KW]; got x {x._shape} and weight {weight._shape}"
            )
        s = pair(stride, "stride", minimum=1)
        p = pair(padding, "padding", minimum=0)
        op_ = pair(output_padding, "output_padding", minimum=0)
        d = pair(dilation, "dilation", minimum=1)
        g = check_int(groups, "groups", minimum=1)
        _, c_in, h, w = x._shape
        wc, c_out_g, kh, kw = weight._shape
        if wc != c_in or c_in % g:
            raise InvalidArgumentError(
                f"conv_transpose2d: weight {weight._shape} must have x's {c_in} input channels"
                f" first, and groups={g} must divide them"
            )
        c_out = c_out_g * g
        if bias is not None:
            check_tensor(b, bias, "bias")
            if bias._shape != (c_out,):
                raise InvalidArgumentError(
                    f"conv_transpose2d: bias must be [{c_out}]; got {bias._shape}"
                )
        for i in range(2):
            if op_[i] >= max(s[i], d[i]):
                raise InvalidArgumentError(
                    f"conv_transpose2d: output_padding {op_} must be smaller than the stride {s}"
                    f" or the dilation {d}"
                )
        sizes = [
            (size - 1) * s[i] - 2 * p[i] + d[i] * (k - 1) + op_[i] + 1
            for i, (size, k) in enumerate(((h, kh), (w, kw)))
        ]
        if min(sizes) <= 0:
            raise InvalidArgumentError(
                f"conv_transpose2d: padding {p} leaves an output of {sizes[0]}x{sizes[1]}"
            )
        ops = self._ops()
        y = x
        for axis, step in ((2, s[0]), (3, s[1])):  # zero-stuffing: step-1 zeros between pixels
            if step > 1 and y._shape[axis] > 0:
                y = self._stuff(y, axis, step)
        widths: list[tuple[int, int]] = []
        for i, k in enumerate((kh, kw)):
            q = d[i] * (k - 1) - p[i]
            widths.append((q, q + op_[i]))
        y = self._pad_or_crop(y, widths)
        # The equivalent forward weight: [C_in, C_out/g] swapped per group, flipped in space.
        wg = ops.reshape(weight, (g, c_in // g, c_out_g, kh, kw))
        wt = ops.reshape(ops.permute(wg, (0, 2, 1, 3, 4)), (c_out, c_in // g, kh, kw))
        wt = ops.flip(wt, (2, 3))
        return ops.conv2d(y, wt, bias, stride=1, padding=0, dilation=d, groups=g)

    def _stuff(self, y: Tensor, axis: int, step: int) -> Tensor:
        ops, f = self._ops(), self.backend.tensor_factory
        shape = y._shape
        size = shape[axis]
        lead, tail = shape[: axis + 1], shape[axis + 1 :]
        column = ops.reshape(y, (*lead, 1, *tail))
        zeros = f.zeros((*lead, step - 1, *tail), y._dtype)
        woven = ops.reshape(
            ops.concat([column, zeros], axis + 1), (*shape[:axis], size * step, *tail)
        )
        return ops.narrow(woven, axis, 0, (size - 1) * step + 1)

    def _pad_or_crop(self, y: Tensor, widths: list[tuple[int, int]]) -> Tensor:
        """Pad the last two axes by the positive amounts, crop by the negative ones."""
        ops = self._ops()
        for i, (before, after) in enumerate(widths):
            axis = 2 + i
            if before < 0 or after < 0:
                start, stop = max(0, -before), y._shape[axis] - max(0, -after)
                y = ops.narrow(y, axis, start, stop - start)
        grow = [(0, 0), (0, 0)] + [(max(0, b), max(0, a)) for b, a in widths]
        if any(b or a for b, a in grow):
            y = ops.pad(y, grow)
        return y


def _divisors(
    size: int, out: int, k: int, s: int, p: int, include_pad: bool
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """avg_pool2d's divisor along one side (PyTorch's: the window clipped to the padded input,
    or to the input itself without ``count_include_pad``)."""
    # Python ints first: a stride beyond int64 is valid when one window fits
    start = np.array([i * s - p for i in range(out)], dtype=np.float64)
    end = np.minimum(start + k, size + p)
    if include_pad:
        return (end - start).astype(np.float64)
    return (np.minimum(end, size) - np.maximum(start, 0)).astype(np.float64)
