"""The WebGPU backend's TensorKernels: every kernel a WGSL compute shader on the adapter.

The core has validated the arguments and allocated ``out`` before a kernel runs; a kernel
generates (or fetches) its shader, packs its parameter words and launches it on the current
stream. Kernels are grouped by module: elementwise here; shape, reduction, linear algebra and
neural-network kernels in :mod:`accelkit_webgpu.kernels_shape`, ``kernels_reduce``,
``kernels_linalg`` and ``kernels_nn``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from accelkit import Tensor
from accelkit.dtype import DType, result_type, scalar_result_type
from accelkit.sdk import Operand, TensorKernels
from accelkit_webgpu import elementwise as ew
from accelkit_webgpu.kernels_linalg import LinalgKernels
from accelkit_webgpu.kernels_nn import NNKernels
from accelkit_webgpu.kernels_reduce import ReduceKernels
from accelkit_webgpu.kernels_shape import ShapeKernels, broadcast_strides
from accelkit_webgpu.submit import WebGPUComponent, scalar_words

__all__ = ["WebGPUTensorKernels"]


_COMPARE = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge,
}  # fmt: skip


def _int_range(dtype: DType) -> tuple[int, int]:
    bits = 8 * dtype.itemsize
    if dtype.is_signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def constant_comparison(op: str, a: Operand, b: Operand, compute: DType) -> bool | None:
    """The result of comparing a tensor with a Python int outside ``compute``'s range (NumPy
    compares the exact values: ``u8 < -1`` is all False), which is the same for every element;
    None when no operand is such an int (the kernel compares)."""
    if not compute.is_integer:
        return None
    lo, hi = _int_range(compute)
    for scalar, tensor_first in ((b, True), (a, False)):
        if type(scalar) is int and not lo <= scalar <= hi:
            cmp = _COMPARE[op]
            return bool(cmp(lo, scalar) if tensor_first else cmp(scalar, lo))
    return None


def _dtype_of(x: Operand, other: Operand) -> DType:
    if isinstance(x, Tensor):
        return x.dtype
    assert isinstance(other, Tensor)
    return scalar_result_type(other.dtype, x)


class WebGPUTensorKernels(
    ShapeKernels, ReduceKernels, LinalgKernels, NNKernels, WebGPUComponent, TensorKernels
):
    # -- elementwise ------------------------------------------------------------------------------
    def _elementwise(
        self,
        source_for: Callable[[bool], str],
        operands: list[tuple[str, Operand]],
        scalar_dtype: DType,
        out: Tensor,
    ) -> None:
        """Launch an elementwise kernel: ``operands`` in binding order; scalars go to
        ``P[1 + k]`` (high words at ``P[4 + k]``) in ``scalar_dtype``; broadcast layouts to
        ``P[7:]``."""
        tensors = [v for _, v in operands if isinstance(v, Tensor)]
        flat = all(t.shape == out.shape for t in tensors)
        params = [out.size, 0, 0, 0, 0, 0, 0]
        for k, (_, v) in enumerate(operands):
            if not isinstance(v, Tensor):
                params[1 + k], params[4 + k] = scalar_words(v, scalar_dtype)
        if not flat:
            params.append(out.ndim)
            params.extend(out.shape)
            for t in tensors:
                params.extend(broadcast_strides(t.shape, out.shape))
        source = source_for(flat)
        self.run_map(source, params, tensors, out)

    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        if op == "bitwise_not":
            src = ew.unary_bitwise_not_source(x.dtype)
            self.run_map(src, [out.size], [x], out)
            return
        self._elementwise(
            lambda flat: ew.unary_source(op, x.dtype, out.dtype, flat), [("a", x)], x.dtype, out
        )

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        da, db = _dtype_of(a, b), _dtype_of(b, a)
        # Comparisons compute in the promoted dtype; everything else in the result's.
        promoted = result_type(da, db) if da is not db else da
        compute = promoted if op in ew.COMPARE else out.dtype
        if op in ew.COMPARE:
            constant = constant_comparison(op, a, b, promoted)
            if constant is not None:
                self.backend.tensor_factory.kernels.fill(out, constant)
                return
        ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
        # A scalar operand is declared in the compute dtype (it was promoted weakly).
        sa = da if ta else compute
        sb = db if tb else compute
        self._elementwise(
            lambda flat: ew.binary_source(op, (sa, ta), (sb, tb), compute, out.dtype, flat),
            [("a", a), ("b", b)],
            compute,
            out,
        )

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
        da = a.dtype if isinstance(a, Tensor) else out.dtype
        db = b.dtype if isinstance(b, Tensor) else out.dtype
        self._elementwise(
            lambda flat: ew.where_source(cond.dtype, (da, ta), (db, tb), out.dtype, flat),
            [("c", cond), ("a", a), ("b", b)],
            out.dtype,
            out,
        )

    def cast(self, x: Tensor, out: Tensor) -> None:
        self.run_map(ew.cast_source(x.dtype, out.dtype), [out.size], [x], out)
