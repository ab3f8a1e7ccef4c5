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

from accelkit.dtype import DType, result_type, scalar_result_type
from accelkit.errors import UnsupportedOperationError
from accelkit.sdk import Operand, TensorKernels, prod, storage
from accelkit.tensor import Tensor
from accelkit_opencl.linalg_ops import CLLinalgOps
from accelkit_opencl.opencl_attention import attention_key_tile, attention_source
from accelkit_opencl.opencl_elementwise import (
    Operand as SourceOperand,
)
from accelkit_opencl.opencl_elementwise import (
    binary_expr,
    cast_expr,
    elementwise_source,
    unary_expr,
)
from accelkit_opencl.opencl_reduction import norm_source, reduce_source, softmax_source
from accelkit_opencl.opencl_training import (
    adam_source,
    cross_entropy_rows_source,
    loss_reduce_source,
    target_error,
)
from accelkit_opencl.opencl_types import (
    broadcast_strides,
    collapse,
    contiguous_strides,
    load_type,
    numpy_scalar,
)
from accelkit_opencl.programs import enqueue_kernel
from accelkit_opencl.submit import CLComponent, launch

__all__ = ["OpenCLTensorKernels"]

_i64 = np.int64


def _not_yet(op: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(f"opencl: {op} is not implemented yet")


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


class OpenCLTensorKernels(CLLinalgOps, CLComponent, TensorKernels):
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
            self.skip([out])
            return
        tensors = [it for it in items if it.is_tensor]
        if out_strides is None:
            out_strides = contiguous_strides(shape)
        cshape, cstrides = collapse(shape, [out_strides, *(it.strides for it in tensors)])
        nd = len(cshape)
        source = elementwise_source(
            out.dtype,
            compute,
            tuple(SourceOperand(it.name, it.dtype, it.is_tensor) for it in items),
            expr,
            nd,
        )
        kernel = self.backend._kernel(source, "ew")
        args: list[Any] = [storage(out), _i64(out_offset)]
        for it in items:
            # is_tensor says what value is (a property mypy cannot narrow through):
            if it.is_tensor:
                args += [storage(it.value), _i64(it.offset)]  # type: ignore[arg-type]
            else:
                args.append(numpy_scalar(load_type(it.dtype), it.value))  # type: ignore[arg-type]
        args.append(_i64(n))
        args += [_i64(d) for d in cshape]
        for strides in cstrides:
            args += [_i64(s) for s in strides]
        self.launch(launch(kernel, args, (n,), None), [it.value for it in tensors], [out])

    def _operand(self, name: str, v: Operand, compute: DType, shape: tuple[int, ...]) -> _Item:
        if type(v) is Tensor:
            return _Item(name, v, v.dtype, broadcast_strides(v.shape, shape))
        return _Item(name, v, compute)

    # -- elementwise ------------------------------------------------------------------------------
    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        compute = out.dtype
        self._strided(
            out,
            out.shape,
            compute,
            unary_expr(op, compute),
            [self._operand("a", x, compute, out.shape)],
        )

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        if out.dtype is DType.BOOL and op in ("eq", "ne", "lt", "le", "gt", "ge"):
            if type(a) is Tensor and type(b) is Tensor:
                compute = result_type(a.dtype, b.dtype)
            elif type(a) is Tensor:
                compute = scalar_result_type(a.dtype, b)
            else:
                # b is the Tensor here (a is not; both are not scalars): `type(x) is` checks
                # do not narrow a union for mypy.
                compute = scalar_result_type(b.dtype, a)  # type: ignore[union-attr]
        else:
            compute = out.dtype
        shape = out.shape
        self._strided(
            out,
            shape,
            compute,
            binary_expr(op, compute),
            [self._operand("a", a, compute, shape), self._operand("b", b, compute, shape)],
        )

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        compute = out.dtype
        shape = out.shape
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

    def cast(self, x: Tensor, out: Tensor) -> None:
        self._strided(
            out,
            out.shape,
            x.dtype,
            cast_expr(x.dtype, out.dtype),
            [self._operand("a", x, x.dtype, out.shape)],
        )

    # -- reductions -------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        if out.size == 0:
            self.skip([out])
            return
        strides = contiguous_strides(x.shape)
        keep = [i for i in range(x.ndim) if i not in axes]
        kshape, (kstrides,) = collapse(
            tuple(x.shape[i] for i in keep), [tuple(strides[i] for i in keep)]
        )
        rshape, (rstrides,) = collapse(
            tuple(x.shape[i] for i in axes), [tuple(strides[i] for i in axes)]
        )
        n_red = prod(tuple(x.shape[i] for i in axes))
        wg = self.backend._reduce_wg
        fp64 = DType.F64 in self.backend.supported_dtypes
        source = reduce_source(op, x.dtype, out.dtype, len(kshape), len(rshape), wg, fp64)
        kernel = self.backend._kernel(source, "reduce")
        args = [storage(out), storage(x), _i64(n_red)]
        args += [_i64(v) for v in (*kshape, *kstrides, *rshape, *rstrides)]
        self.launch(launch(kernel, args, (out.size * wg,), (wg,)), [x], [out])

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
        item = _Item("a", x, x.dtype, x_strides, x_offset)
        self._strided(
            out, shape, x.dtype, "a", [item], out_strides=out_strides, out_offset=out_offset
        )

    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        strides = contiguous_strides(x.shape)
        self._copy(out, x, out.shape, tuple(strides[a] for a in axes))

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        out_strides = contiguous_strides(out.shape)
        position = 0
        wrote = False
        for t in tensors:
            if t.size:
                self._copy(
                    out,
                    t,
                    t.shape,
                    contiguous_strides(t.shape),
                    out_strides=out_strides,
                    out_offset=position * out_strides[axis],
                )
                wrote = True
            position += t.shape[axis]
        if not wrote:
            self.skip([out])

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        strides = contiguous_strides(x.shape)
        self._copy(out, x, out.shape, strides, start * strides[axis])

    def take(self, x: Tensor, axis: int, index: np.ndarray[Any, Any] | range, out: Tensor) -> None:
        """An evenly spaced index (flip, strided narrow, broadcast) is a strided copy; any
        other (pad's mirrors, tile) goes through the take kernel with the index uploaded."""
        from accelkit_opencl.opencl_index import take_source

        n = out.size
        if n == 0:
            self.skip([out])
            return
        strides = contiguous_strides(x.shape)
        if isinstance(index, range):
            view = tuple(s * index.step if a == axis else s for a, s in enumerate(strides))
            self._copy(out, x, out.shape, view, index.start * strides[axis])
            return
        if len(index) == 1 or bool(np.all(np.diff(index) == index[1] - index[0])):
            step = int(index[1] - index[0]) if len(index) > 1 else 0
            view = tuple(s * step if a == axis else s for a, s in enumerate(strides))
            self._copy(out, x, out.shape, view, int(index[0]) * strides[axis])
            return
        table = self.backend.tensor_factory.from_host(index, dtype=DType.I64)
        kernel = self.backend._kernel(take_source(x.dtype, x.ndim, axis), "take")
        args: list[Any] = [storage(out), storage(x), storage(table), _i64(n)]
        args += [_i64(d) for d in out.shape] + [_i64(s) for s in strides]
        self.launch(launch(kernel, args, (n,), None), [x, table], [out])

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        from accelkit_opencl.opencl_index import checked_launch, gather_source, index_error

        n = out.size
        if n == 0:
            self.skip([out])
            return
        dim = x.shape[axis]
        kernel = self.backend._kernel(gather_source(x.dtype, index.dtype, x.ndim, axis), "gather")
        args: list[Any] = [storage(out), storage(x), storage(index), None, _i64(n), _i64(dim)]
        args += [_i64(d) for d in index.shape]
        args += [_i64(s) for s in contiguous_strides(x.shape)]
        self._enqueue_checked(
            checked_launch(kernel, args, (n,)),
            [x, index],
            [out],
            lambda v: index_error("gather", "index", v, -dim, dim),
            unsigned=index.dtype is DType.U64,
        )

    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        self._scatter(x, axis, index, src, out, None)

    def scatter_reduce(
        self, op: str, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        self._scatter(x, axis, index, src, out, op)

    def _scatter(
        self,
        x: Tensor,
        axis: int,
        index: Tensor,
        src: Tensor | int | float,
        out: Tensor,
        reduce: str | None,
    ) -> None:
        from accelkit_opencl.opencl_index import checked_launch, index_error, scatter_source

        x_strides = contiguous_strides(x.shape)
        if out.size:
            self._copy(out, x, x.shape, x_strides)
        length = index.shape[axis]
        lines = index.size // length if length else 0
        if lines == 0:
            if not out.size:
                self.skip([out])
            return
        dim = x.shape[axis]
        scalar: str | None = None
        if isinstance(src, Tensor):
            value, src_shape = storage(src), src.shape
        else:
            scalar = load_type(x.dtype)
            value, src_shape = numpy_scalar(scalar, src), index.shape
        source = scatter_source(x.dtype, index.dtype, x.ndim, axis, scalar, reduce)
        kernel = self.backend._kernel(source, "scatter")
        args: list[Any] = [storage(out), value, storage(index), None, _i64(lines), _i64(length)]
        args.append(_i64(dim))
        args += [_i64(d) for d in index.shape]
        args += [_i64(s) for s in x_strides]
        args += [_i64(s) for s in contiguous_strides(src_shape)]
        self._enqueue_checked(
            checked_launch(kernel, args, (lines,)),
            [index, src],
            [out],
            lambda v: index_error("scatter", "index", v, -dim, dim),
            unsigned=index.dtype is DType.U64,
        )

    # -- neural-network ops -----------------------------------------------------------------------
    def conv2d(
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
        from accelkit_opencl.opencl_conv import conv2d_source

        n, o, oh, ow = out.shape
        if out.size == 0:
            self.skip([out])
            return
        _, c, h, w = x.shape
        _, cg, kh, kw = weight.shape
        kernel = self.backend._kernel(conv2d_source(x.dtype, bias is not None), "conv2d")
        args: list[Any] = [storage(out), storage(x), storage(weight)]
        if bias is not None:
            args.append(storage(bias))
        dims = (c, h, w, o, cg, kh, kw, oh, ow, *stride, *padding, *dilation, o // groups)
        args += [np.int32(v) for v in dims]
        self.launch(launch(kernel, args, (ow, oh, n * o), None), [x, weight, bias], [out])

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        if out.size == 0:
            self.skip([out])
            return
        b, h, sq, d = q.shape
        hk, skv, dv = k.shape[1], k.shape[2], v.shape[3]
        dev = self.backend._cl_device
        bk = attention_key_tile(q.dtype, d, dv, int(dev.local_mem_size))
        if bk < 1:
            raise UnsupportedOperationError(
                f"opencl: attention with head dims {d} and {dv} does not fit one key tile in"
                f" the device's {int(dev.local_mem_size)} bytes of local memory"
            )
        bq = int(self.backend._variant("attention_rows"))  # query rows per work-group
        mdt = mask.dtype if mask is not None else None
        source = attention_source(q.dtype, mdt, d, dv, bq, bk, causal)
        kernel = self.backend._kernel(source, "attention")
        args: list[Any] = [storage(out), storage(q), storage(k), storage(v)]
        if mask is not None:
            args.append(storage(mask))
        args += [_i64(h), _i64(h // hk), _i64(sq), _i64(skv)]
        args.append(numpy_scalar(load_type(q.dtype), scale))
        if mask is not None:
            args += [_i64(st) for st in broadcast_strides(mask.shape, (b, h, sq, skv))]
        global_size = (-(-sq // bq) * bq, b * h)
        self.launch(launch(kernel, args, global_size, (bq, 1)), [q, k, v, mask], [out])

    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        if out.size == 0:
            self.skip([out])
            return
        length = x.shape[axis]
        inner = prod(x.shape[axis + 1 :])
        rows = out.size // length
        wg = self.backend._reduce_wg
        kernel = self.backend._kernel(softmax_source(x.dtype, out.dtype, log, wg), "softmax")
        args = [storage(out), storage(x), _i64(length), _i64(inner)]
        self.launch(launch(kernel, args, (rows * wg,), (wg,)), [x], [out])

    def _norm(
        self,
        kind: str,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        out: Tensor,
    ) -> None:
        if out.size == 0:
            self.skip([out])
            return
        d = x.shape[-1]
        wg = self.backend._reduce_wg
        source = norm_source(kind, x.dtype, weight is not None, bias is not None, wg)
        kernel = self.backend._kernel(source, "norm")
        args: list[Any] = [storage(out), storage(x)]
        args += [storage(t) for t in (weight, bias) if t is not None]
        args += [_i64(d), numpy_scalar(load_type(x.dtype), eps)]
        self.launch(launch(kernel, args, ((out.size // d) * wg,), (wg,)), [x, weight, bias], [out])

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._norm("layer", x, weight, bias, eps, out)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._norm("rms", x, weight, None, eps, out)

    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        n, c = logits.shape
        dt = logits.dtype
        wg = self.backend._reduce_wg
        rows = self.empty((n,), DType.F64 if load_type(dt) == "double" else DType.F32)
        err = self.empty((2,), DType.I64)
        ce = self.backend._kernel(cross_entropy_rows_source(dt, targets.dtype, wg), "ce_rows")
        ce_args = [
            storage(probs),
            storage(rows),
            storage(err),
            storage(logits),
            storage(targets),
            _i64(c),
        ]

        flag = np.zeros(2, np.int64)  # [set, first bad target], read back by the same command

        def run_rows(queue: Any, wait_for: list[Any] | None) -> Any:
            zero = np.zeros(1, np.int64)
            cl.enqueue_fill_buffer(queue, storage(err), zero, 0, 16, wait_for=wait_for)
            if n:
                enqueue_kernel(queue, ce, ce_args, (n * wg,), (wg,))
            return cl.enqueue_copy(queue, flag, storage(err), is_blocking=False)

        def check() -> BaseException | None:
            return target_error(c, int(flag[1])) if flag[0] else None

        seq = self.launch(run_rows, [logits, targets], [probs, rows, err], keepalive=[flag])
        self.current_stream.add_check(seq, check)
        if reduction == "none":
            self.cast(rows, loss)
            return
        red = self.backend._kernel(loss_reduce_source(dt, reduction == "mean", wg), "loss_reduce")
        self.launch(
            launch(red, [storage(loss), storage(rows), _i64(n)], (wg,), (wg,)), [rows], [loss]
        )

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        from accelkit_opencl.opencl_index import checked_launch, embedding_source, index_error

        n = out.size
        if n == 0:
            self.skip([out])
            return
        rows, width = weight.shape
        kernel = self.backend._kernel(embedding_source(weight.dtype, indices.dtype), "embedding")
        args: list[Any] = [
            storage(out),
            storage(weight),
            storage(indices),
            None,
            _i64(n),
            _i64(rows),
        ]
        args.append(_i64(width))
        self._enqueue_checked(
            checked_launch(kernel, args, (n,)),
            [indices, weight],
            [out],
            lambda v: index_error("embedding", "indices", v, 0, rows),
            unsigned=indices.dtype is DType.U64,
        )

    def adam_update(
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
        n = param.size
        if n == 0:
            self.skip([param, m, v])
            return
        t = load_type(param.dtype)
        kernel = self.backend._kernel(adam_source(param.dtype, bool(weight_decay)), "adam")
        hyper = (lr, beta1, beta2, eps, 1.0 - beta1**step, 1.0 - beta2**step, weight_decay)
        args = [storage(param), storage(grad), storage(m), storage(v), _i64(n)]
        args += [numpy_scalar(t, x) for x in hyper]
        self.launch(launch(kernel, args, (n,), None), [param, grad, m, v], [param, m, v])
