"""The OpenCL backend's TensorOps: every kernel hook enqueues an OpenCL C kernel.

The kernels are generated (``opencl_elementwise``, ``opencl_linalg``, ``opencl_reduction``) for
the dtypes and ranks a call needs, built once per backend through the program cache, and
enqueued on the current stream's command queue after the inputs' writers on other queues.
Hooks without a device kernel yet raise UnsupportedOperationError; none computes on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from accelkit._core.shapes import broadcast_shapes, prod
from accelkit.abc.tensor_ops import Operand, TensorOps
from accelkit.dtype import DType, result_type, scalar_result_type
from accelkit.errors import UnsupportedOperationError
from accelkit.tensor import Tensor
from accelkit_opencl.opencl_elementwise import (
    Operand as SourceOperand,
)
from accelkit_opencl.opencl_elementwise import (
    binary_expr,
    cast_expr,
    elementwise_source,
    unary_expr,
)
from accelkit_opencl.opencl_linalg import gemm_source
from accelkit_opencl.opencl_reduction import norm_source, reduce_source, softmax_source
from accelkit_opencl.opencl_types import (
    broadcast_strides,
    collapse,
    contiguous_strides,
    load_type,
    numpy_scalar,
)
from accelkit_opencl.submit import CLComponent

__all__ = ["OpenCLTensorOps"]

_i64 = np.int64


def _not_yet(op: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(f"opencl: {op} is not implemented yet")


def _wide_enough(compute: DType, a: Operand, b: Operand) -> DType:
    """A comparison with a Python int the integer dtype cannot hold (``u8 < 1000``) compares
    in I64 (or F64), so the scalar is not wrapped."""
    if not compute.is_integer:
        return compute
    for v in (a, b):
        if isinstance(v, int) and not isinstance(v, bool):
            info = np.iinfo(compute.to_numpy())
            if not int(info.min) <= v <= int(info.max):
                return (
                    DType.I64 if -(2**63) <= v < 2**63 and compute is not DType.U64 else DType.F64
                )
    return compute


@dataclass(frozen=True)
class _Item:
    """An input of a strided elementwise kernel."""

    name: str
    value: Tensor | int | float | bool
    dtype: DType
    strides: tuple[int, ...] = ()
    offset: int = 0

    @property
    def is_tensor(self) -> bool:
        return type(self.value) is Tensor


def _launch(kernel: Any, args: Sequence[Any], global_size: tuple[int, ...], local: Any) -> Any:
    def run(queue: Any, wait_for: list[Any] | None) -> Any:
        kernel.set_args(*args)
        return cl.enqueue_nd_range_kernel(queue, kernel, global_size, local, wait_for=wait_for)

    return run


class OpenCLTensorOps(CLComponent, TensorOps):
    # -- the strided elementwise loop every copy-like op runs on ----------------------------------
    def _strided(
        self,
        out: Tensor,
        shape: tuple[int, ...],
        compute: DType,
        expr: str,
        items: Sequence[_Item],
        *,
        out_strides: tuple[int, ...] | None = None,
        out_offset: int = 0,
    ) -> None:
        n = prod(shape)
        if n == 0:
            self._skip([out])
            return
        tensors = [it for it in items if it.is_tensor]
        if out_strides is None:
            out_strides = contiguous_strides(shape)
        cshape, cstrides = collapse(shape, [out_strides, *(it.strides for it in tensors)])
        nd = len(cshape)
        source = elementwise_source(
            out._dtype,
            compute,
            [SourceOperand(it.name, it.dtype, it.is_tensor) for it in items],
            expr,
            nd,
        )
        kernel = self.backend._kernel(source, "ew")
        args: list[Any] = [out._data, _i64(out_offset)]
        for it in items:
            if it.is_tensor:
                args += [it.value._data, _i64(it.offset)]  # type: ignore[union-attr]
            else:
                args.append(numpy_scalar(load_type(it.dtype), it.value))  # type: ignore[arg-type]
        args.append(_i64(n))
        args += [_i64(d) for d in cshape]
        for strides in cstrides:
            args += [_i64(s) for s in strides]
        self._enqueue(_launch(kernel, args, (n,), None), [it.value for it in tensors], [out])

    def _operand(self, name: str, v: Operand, compute: DType, shape: tuple[int, ...]) -> _Item:
        if type(v) is Tensor:
            return _Item(name, v, v._dtype, broadcast_strides(v._shape, shape))
        return _Item(name, v, compute)  # type: ignore[arg-type]

    # -- elementwise ------------------------------------------------------------------------------
    def _k_unary(self, op: str, x: Tensor, out: Tensor) -> None:
        compute = out._dtype
        self._strided(
            out,
            out._shape,
            compute,
            unary_expr(op, compute),
            [self._operand("a", x, compute, out._shape)],
        )

    def _k_binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        if out._dtype is DType.BOOL and op in ("eq", "ne", "lt", "le", "gt", "ge"):
            if type(a) is Tensor and type(b) is Tensor:
                compute = result_type(a._dtype, b._dtype)
            elif type(a) is Tensor:
                compute = scalar_result_type(a._dtype, b)  # type: ignore[arg-type]
            else:
                compute = scalar_result_type(b._dtype, a)  # type: ignore[union-attr]
            compute = _wide_enough(compute, a, b)
        else:
            compute = out._dtype
        shape = out._shape
        self._strided(
            out,
            shape,
            compute,
            binary_expr(op, compute),
            [self._operand("a", a, compute, shape), self._operand("b", b, compute, shape)],
        )

    def _k_where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        compute = out._dtype
        shape = out._shape
        self._strided(
            out,
            shape,
            compute,
            "(c ? a : b)",
            [
                self._operand("c", cond, compute, shape),
                self._operand("a", a, compute, shape),
                self._operand("b", b, compute, shape),
            ],
        )

    def _k_cast(self, x: Tensor, out: Tensor) -> None:
        self._strided(
            out,
            out._shape,
            x._dtype,
            cast_expr(x._dtype, out._dtype),
            [self._operand("a", x, x._dtype, out._shape)],
        )

    # -- linear algebra ---------------------------------------------------------------------------
    def _gemm_launch(
        self,
        out: Tensor,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        mnk: tuple[int, int, int],
        a_mk: tuple[int, int],
        b_kn: tuple[int, int],
        c_mn: tuple[int, int],
        batch: tuple[int, ...],
        batch_strides: list[tuple[int, ...]],
        alpha: float,
        beta: float,
    ) -> None:
        m, n, k = mnk
        if out._size == 0:
            self._skip([out])
            return
        bshape, bstrides = collapse(batch, batch_strides) if batch else ((1,), [(0,)] * 3)
        if len(bshape) > 3:
            raise UnsupportedOperationError(
                f"opencl: matmul over {len(bshape)} independent broadcast batch dimensions"
                " (at most 3) is not implemented yet"
            )
        pad = 3 - len(bshape)
        bshape = (1,) * pad + bshape
        bstrides = [(0,) * pad + s for s in bstrides]
        ts, wpt = self.backend._gemm_tiles(out._dtype)
        rts = ts // wpt
        source = gemm_source(
            a._dtype, b._dtype, c._dtype if c is not None else None, out._dtype, ts, wpt
        )
        kernel = self.backend._kernel(source, "gemm")
        t = load_type(out._dtype)
        args: list[Any] = [out._data, a._data, b._data]
        if c is not None:
            args.append(c._data)
        args += [np.int32(m), np.int32(n), np.int32(k)]
        args += [_i64(s) for s in (*a_mk, *b_kn, *c_mn)]
        args += [_i64(bshape[1]), _i64(bshape[2])]
        for strides in bstrides:
            args += [_i64(s) for s in strides]
        args += [numpy_scalar(t, alpha), numpy_scalar(t, beta)]
        nbatch = prod(bshape)
        global_size = (-(-n // ts) * rts, -(-m // ts) * rts, nbatch)
        self._enqueue(_launch(kernel, args, global_size, (rts, rts, 1)), [a, b, c], [out])

    def _k_gemm(
        self,
        a: Tensor,
        b: Tensor,
        c: Tensor | None,
        out: Tensor,
        trans_a: bool,
        trans_b: bool,
        alpha: float,
        beta: float,
    ) -> None:
        batched = out.ndim == 3
        m, n = out._shape[-2], out._shape[-1]
        k = a._shape[-2] if trans_a else a._shape[-1]
        ra, rb = a._shape[-1], b._shape[-1]
        a_mk = (1, ra) if trans_a else (ra, 1)
        b_kn = (1, rb) if trans_b else (rb, 1)
        c_strides = broadcast_strides(c._shape, out._shape) if c is not None else (0,) * out.ndim
        batch: tuple[int, ...] = ()
        bstrides: list[tuple[int, ...]] = [(), (), ()]
        if batched:
            batch = (out._shape[0],)
            bstrides = [(a._shape[-2] * ra,), (b._shape[-2] * rb,), (c_strides[0],)]
        self._gemm_launch(
            out, a, b, c, (m, n, k), a_mk, b_kn, c_strides[-2:], batch, bstrides, alpha, beta
        )

    def _k_matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        a2 = a._shape if a.ndim > 1 else (1, a._shape[0])
        b2 = b._shape if b.ndim > 1 else (b._shape[0], 1)
        m, k, n = a2[-2], a2[-1], b2[-1]
        batch = broadcast_shapes(a2[:-2], b2[:-2])
        sa = tuple(s * m * k for s in broadcast_strides(a2[:-2], batch))
        sb = tuple(s * k * n for s in broadcast_strides(b2[:-2], batch))
        self._gemm_launch(
            out, a, b, None, (m, n, k), (k, 1), (n, 1), (0, 0), batch,
            [sa, sb, (0,) * len(batch)], 1.0, 0.0,
        )  # fmt: skip

    def _k_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        k = weight._shape[1]
        n = weight._shape[0]
        m = x._size // k if k else prod(x._shape[:-1])
        self._gemm_launch(
            out, x, weight, bias, (m, n, k), (k, 1), (1, k), (0, 1), (), [(), (), ()],
            1.0, 1.0 if bias is not None else 0.0,
        )  # fmt: skip

    # -- reductions -------------------------------------------------------------------------------
    def _k_reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        if out._size == 0:
            self._skip([out])
            return
        strides = contiguous_strides(x._shape)
        keep = [i for i in range(x.ndim) if i not in axes]
        kshape, (kstrides,) = collapse(
            tuple(x._shape[i] for i in keep), [tuple(strides[i] for i in keep)]
        )
        rshape, (rstrides,) = collapse(
            tuple(x._shape[i] for i in axes), [tuple(strides[i] for i in axes)]
        )
        n_red = prod(tuple(x._shape[i] for i in axes))
        wg = self.backend._reduce_wg
        source = reduce_source(op, x._dtype, out._dtype, len(kshape), len(rshape), wg)
        kernel = self.backend._kernel(source, "reduce")
        args = [out._data, x._data, _i64(n_red)]
        args += [_i64(v) for v in (*kshape, *kstrides, *rshape, *rstrides)]
        self._enqueue(_launch(kernel, args, (out._size * wg,), (wg,)), [x], [out])

    # -- shape ------------------------------------------------------------------------------------
    def _copy(
        self,
        out: Tensor,
        x: Tensor,
        shape: tuple[int, ...],
        x_strides: tuple[int, ...],
        x_offset: int = 0,
        out_strides: tuple[int, ...] | None = None,
        out_offset: int = 0,
    ) -> None:
        item = _Item("a", x, x._dtype, x_strides, x_offset)
        self._strided(
            out, shape, x._dtype, "a", [item], out_strides=out_strides, out_offset=out_offset
        )

    def _k_permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        strides = contiguous_strides(x._shape)
        self._copy(out, x, out._shape, tuple(strides[a] for a in axes))

    def _k_concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        out_strides = contiguous_strides(out._shape)
        position = 0
        wrote = False
        for t in tensors:
            if t._size:
                self._copy(
                    out,
                    t,
                    t._shape,
                    contiguous_strides(t._shape),
                    out_strides=out_strides,
                    out_offset=position * out_strides[axis],
                )
                wrote = True
            position += t._shape[axis]
        if not wrote:
            self._skip([out])

    def _k_narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        strides = contiguous_strides(x._shape)
        self._copy(out, x, out._shape, strides, start * strides[axis])

    def _k_gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        raise _not_yet("gather")

    def _k_scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        raise _not_yet("scatter")

    # -- neural-network ops -----------------------------------------------------------------------
    def _k_conv2d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        out: Tensor,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
    ) -> None:
        raise _not_yet("conv2d")

    def _k_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        raise _not_yet("attention")

    def _k_softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        if out._size == 0:
            self._skip([out])
            return
        length = x._shape[axis]
        inner = prod(x._shape[axis + 1 :])
        rows = out._size // length
        wg = self.backend._reduce_wg
        kernel = self.backend._kernel(softmax_source(x._dtype, out._dtype, log, wg), "softmax")
        args = [out._data, x._data, _i64(length), _i64(inner)]
        self._enqueue(_launch(kernel, args, (rows * wg,), (wg,)), [x], [out])

    def _norm(
        self,
        kind: str,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        out: Tensor,
    ) -> None:
        if out._size == 0:
            self._skip([out])
            return
        d = x._shape[-1]
        wg = self.backend._reduce_wg
        source = norm_source(kind, x._dtype, weight is not None, bias is not None, wg)
        kernel = self.backend._kernel(source, "norm")
        args: list[Any] = [out._data, x._data]
        args += [t._data for t in (weight, bias) if t is not None]
        args += [_i64(d), numpy_scalar(load_type(x._dtype), eps)]
        self._enqueue(
            _launch(kernel, args, ((out._size // d) * wg,), (wg,)), [x, weight, bias], [out]
        )

    def _k_layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._norm("layer", x, weight, bias, eps, out)

    def _k_rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._norm("rms", x, weight, None, eps, out)

    def _k_cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        raise _not_yet("cross_entropy")

    def _k_embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        raise _not_yet("embedding")

    def _k_adam_update(
        self,
        param: Tensor,
        grad: Tensor,
        m: Tensor,
        v: Tensor,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        step: int,
        weight_decay: float,
    ) -> None:
        raise _not_yet("adam_update")
