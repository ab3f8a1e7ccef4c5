"""The CUDA backend's TensorOps: each kernel hook launches CuPy (cuBLAS, CUB) kernels."""

from __future__ import annotations

from typing import Any

import cupy as cp

from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.sdk import Operand, TensorKernels
from accelkit.tensor import Tensor
from accelkit_cuda import cupy_kernels as ck
from accelkit_cuda.submit import CUDAComponent, xa

__all__ = ["CUDATensorKernels", "range_error"]


def range_error(op: str, what: str, low: int, high: int) -> Any:
    def error(_flag: int, value: int) -> BaseException:
        return InvalidArgumentError(f"{op}: {what} must lie in {low}..{high - 1}; got {value}")

    return error


class CUDATensorKernels(CUDAComponent, TensorKernels):
    # -- elementwise ------------------------------------------------------------------------------
    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        self._launch(lambda: ck.unary(op, x._data, out._data), (x,), (out,), what=op)

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        if op == "add" and type(a) is Tensor and type(b) is Tensor and a._dtype is b._dtype:
            self._launch(lambda: cp.add(a._data, b._data, out=out._data), (a, b), (out,), what=op)
            return
        self._launch(lambda: ck.binary(op, xa(a), xa(b), out._data), (a, b), (out,), what=op)

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        self._launch(
            lambda: ck.where(cond._data, xa(a), xa(b), out._data), (cond, a, b), (out,),
            what="where",
        )  # fmt: skip

    def cast(self, x: Tensor, out: Tensor) -> None:
        self._launch(lambda: ck.cast_into(x._data, out._data), (x,), (out,), what="cast")

    # -- linear algebra ---------------------------------------------------------------------------
    def gemm(
        self, a: Tensor, b: Tensor, c: Tensor | None, out: Tensor, trans_a: bool, trans_b: bool,
        alpha: float, beta: float,
    ) -> None:  # fmt: skip
        self._launch(
            lambda: ck.gemm(a._data, b._data, xa(c), out._data, trans_a, trans_b, alpha, beta),
            (a, b, c), (out,), what="gemm",
        )  # fmt: skip

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        self._launch(lambda: ck.matmul(a._data, b._data, out._data), (a, b), (out,), what="matmul")

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self._launch(
            lambda: ck.linear(x._data, weight._data, xa(bias), out._data), (x, weight, bias),
            (out,), what="linear",
        )  # fmt: skip

    # -- reductions -------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        self._launch(
            lambda: ck.reduce(op, x._data, axes, keepdims, out._data), (x,), (out,), what=op
        )

    # -- shape ------------------------------------------------------------------------------------
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        self._launch(
            lambda: cp.copyto(out._data, cp.transpose(x._data, axes)), (x,), (out,),
            what="permute",
        )  # fmt: skip

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        self._launch(
            lambda: cp.concatenate([t._data for t in tensors], axis=axis, out=out._data),
            tensors, (out,), what="concat",
        )  # fmt: skip

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        def run() -> None:
            index: list[Any] = [slice(None)] * x.ndim
            index[axis] = slice(start, start + out._shape[axis])
            cp.copyto(out._data, x._data[tuple(index)])

        self._launch(run, (x,), (out,), what="narrow")

    def _corner(self, t: Any, index: Tensor, axis: int) -> Any:
        return t[
            tuple(slice(0, d) if i != axis else slice(None) for i, d in enumerate(index._shape))
        ]

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        dim = x._shape[axis]

        def run() -> Any:
            idx = index._data.astype(cp.int64)
            flag = ck.range_flag(idx, -dim, dim)
            idx = cp.clip(cp.where(idx < 0, idx + dim, idx), 0, max(dim - 1, 0))
            if out._size:
                src = self._corner(x._data, index, axis)
                cp.copyto(out._data, cp.take_along_axis(src, idx, axis=axis))
            return flag

        self._launch_checked(run, (x, index), (out,), range_error("gather", "index", -dim, dim))

    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        dim = x._shape[axis]

        def run() -> Any:
            idx = index._data.astype(cp.int64)
            flag = ck.range_flag(idx, -dim, dim)
            idx = cp.clip(cp.where(idx < 0, idx + dim, idx), 0, max(dim - 1, 0))
            cp.copyto(out._data, x._data)
            if isinstance(src, Tensor):
                values = src._data[tuple(slice(0, d) for d in index._shape)]
            else:
                values = cp.full(index._shape, src, dtype=out._data.dtype)
            region = self._corner(out._data, index, axis)
            if index._size:
                cp.put_along_axis(region, idx, values, axis=axis)
            return flag

        self._launch_checked(
            run, (x, index, src), (out,), range_error("scatter", "index", -dim, dim)
        )

    # -- neural-network ops -----------------------------------------------------------------------
    def conv2d(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor,
        stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int], groups: int,
    ) -> None:  # fmt: skip
        self._launch(
            lambda: ck.conv2d(
                x._data, weight._data, xa(bias), out._data, stride, padding, dilation, groups
            ),
            (x, weight, bias), (out,), what="conv2d",
        )  # fmt: skip

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
        causal: bool,
    ) -> None:  # fmt: skip
        kernel_ops = self.backend._kernel_ops
        if kernel_ops is not None and mask is None:
            # The flash kernel: no score matrix in memory at all.
            flash: Any = kernel_ops.kernels
            if flash.can_flash(q, k, v):
                try:
                    flash.attention(q, k, v, None, out, scale, causal)
                    return
                except UnsupportedOperationError:
                    pass  # the fused program is unavailable (no NVRTC): cuBLAS below
        self._launch(
            lambda: ck.attention(q._data, k._data, v._data, xa(mask), out._data, scale, causal),
            (q, k, v, mask), (out,), what="attention",
        )  # fmt: skip

    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        self._launch(
            lambda: ck.softmax(x._data, axis, out._data, log), (x,), (out,), what="softmax"
        )

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._launch(
            lambda: ck.layer_norm(x._data, xa(weight), xa(bias), eps, out._data),
            (x, weight, bias), (out,), what="layer_norm",
        )  # fmt: skip

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._launch(
            lambda: ck.rms_norm(x._data, xa(weight), eps, out._data), (x, weight), (out,),
            what="rms_norm",
        )  # fmt: skip

    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        n = logits._shape[1]
        self._launch_checked(
            lambda: ck.cross_entropy(
                logits._data, targets._data, reduction, loss._data, probs._data
            ),
            (logits, targets), (loss, probs), range_error("cross_entropy", "targets", 0, n),
        )  # fmt: skip

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        n = weight._shape[0]
        self._launch_checked(
            lambda: ck.embedding(indices._data, weight._data, out._data),
            (indices, weight), (out,), range_error("embedding", "indices", 0, n),
        )  # fmt: skip

    def adam_update(
        self, param: Tensor, grad: Tensor, m: Tensor, v: Tensor, lr: float, beta1: float,
        beta2: float, eps: float, step: int, weight_decay: float,
    ) -> None:  # fmt: skip
        self._launch(
            lambda: ck.adam_update(
                param._data, grad._data, m._data, v._data, lr, beta1, beta2, eps, step,
                weight_decay,
            ),
            (param, grad, m, v), (param, m, v), what="adam_update",
        )  # fmt: skip
