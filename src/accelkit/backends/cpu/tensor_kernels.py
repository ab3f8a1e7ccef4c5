"""The CPU backend's TensorOps: each kernel hook submits a NumPy body
(:mod:`accelkit._core.host_kernels`) to the current stream, with the CPU JIT as its accelerator
where it takes one."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from accelkit._core.host_jit import JIT
from accelkit._core.host_kernels import elementwise as ew
from accelkit._core.host_kernels import image as img
from accelkit._core.host_kernels import nn
from accelkit._core.host_stream import HostStream
from accelkit.backends.cpu.submit import INLINE_MAX_COST, CPUComponent, arr
from accelkit.dtype import DType
from accelkit.sdk.kernels import Operand, TensorKernels
from accelkit.tensor import Tensor

__all__ = ["CPUTensorKernels"]

#: Binary ops that are one NumPy ufunc when both inputs and the output share a dtype (F16 and
#: BF16 included: NumPy and ml_dtypes compute them in F32 and round once).
_SAME_DTYPE_UFUNCS: dict[str, Any] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}


#: F32 and F64: computed by NumPy in their own dtype (F16 and BF16 go through F32).
_WIDE_FLOATS = frozenset({DType.F32, DType.F64})


class CPUTensorKernels(CPUComponent, TensorKernels):
    # -- elementwise ------------------------------------------------------------------------------
    def _submit1(self, run: Any, x: Tensor, out: Tensor, cost: int) -> None:
        """Submit ``run`` (a partial: no frame of ours when it runs) reading ``x`` and writing
        ``out``: :meth:`_launch`, inlined where the backend has one stream (no dependencies)."""
        backend = self.backend
        if len(backend._streams) == 1:
            stream: HostStream = backend._default  # type: ignore[assignment]  # set while ready
            seq = stream.submit(run, cost > INLINE_MAX_COST, (), (x, out))
            out._stream = stream  # mark_written((out,), stream, seq), inlined
            out._seq = seq
            out._buffer.last_write = (stream, seq)
            return
        self._launch(run, cost, (x,), (out,))

    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        self._submit1(partial(ew.unary, op, x._data, out._data, accel=JIT), x, out, out._size)

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        ufunc = _SAME_DTYPE_UFUNCS.get(op)
        if (
            ufunc is not None
            and type(a) is Tensor
            and type(b) is Tensor
            and a._dtype is b._dtype is out._dtype
        ):
            # The fast path of the commonest ops: no dtype juggling, and (when the inputs were
            # written on this stream, or are done) no dependency bookkeeping. The ufunc runs
            # through a partial: no Python frame of our own.
            run = partial(ufunc, a._data, b._data, out=out._data)
            backend = self.backend
            if len(backend._streams) == 1:  # one stream: no dependencies (see _launch)
                stream: HostStream = backend._default  # type: ignore[assignment]  # set while ready
                seq = stream.submit(run, out._size > INLINE_MAX_COST, (), (a, b, out))
                out._stream = stream  # mark_written((out,), stream, seq), inlined
                out._seq = seq
                out._buffer.last_write = (stream, seq)
                return
            self._launch(run, out._size, (a, b), (out,))
            return
        if (
            ufunc is not None
            and type(a) is Tensor
            and (type(b) is float or type(b) is int)
            and a._dtype is out._dtype
            and out._dtype in _WIDE_FLOATS
        ):
            # A float tensor and a weak Python number: ew.binary's last line, without its
            # dispatch (nor a frame of ours: the ufunc runs through a partial).
            run = partial(ufunc, a._data, b, out=out._data, casting="unsafe")
            self._launch(run, out._size, (a,), (out,))
            return
        self._launch(lambda: ew.binary(op, arr(a), arr(b), out._data), out._size, (a, b), (out,))

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        self._launch(
            lambda: ew.where(cond._data, arr(a), arr(b), out._data), out._size, (cond, a, b), (out,)
        )

    def cast(self, x: Tensor, out: Tensor) -> None:
        self._launch(lambda: ew.cast_into(x._data, out._data), out._size, (x,), (out,))

    # -- linear algebra ---------------------------------------------------------------------------
    def gemm(
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
        k = a._shape[-1] if not trans_a else a._shape[-2]
        self._launch(
            lambda: nn.gemm(a._data, b._data, arr(c), out._data, trans_a, trans_b, alpha, beta),
            out._size * k,
            (a, b, c),
            (out,),
        )

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        self._launch(
            lambda: nn.matmul(a._data, b._data, out._data), out._size * a._shape[-1], (a, b), (out,)
        )

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self._launch(
            lambda: nn.linear(x._data, weight._data, arr(bias), out._data),
            out._size * weight._shape[1],
            (x, weight, bias),
            (out,),
        )

    # -- reductions -------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        self._submit1(partial(ew.reduce, op, x._data, axes, keepdims, out._data), x, out, x._size)

    # -- shape ------------------------------------------------------------------------------------
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        self._launch(
            lambda: np.copyto(out._data, np.transpose(x._data, axes)), out._size, (x,), (out,)
        )

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        self._launch(
            lambda: np.concatenate([t._data for t in tensors], axis=axis, out=out._data),
            out._size,
            tensors,
            (out,),
        )

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        def run() -> None:
            index: list[Any] = [slice(None)] * x.ndim
            index[axis] = slice(start, start + out._shape[axis])
            np.copyto(out._data, x._data[tuple(index)])

        self._launch(run, out._size, (x,), (out,))

    def take(self, x: Tensor, axis: int, index: np.ndarray[Any, Any] | range, out: Tensor) -> None:
        self._launch(lambda: ew.take(x._data, axis, index, out._data), out._size, (x,), (out,))

    def cumulative(
        self, op: str, x: Tensor, axis: int, exclusive: bool, reverse: bool, out: Tensor
    ) -> None:
        self._launch(
            lambda: ew.cumulative(op, x._data, axis, exclusive, reverse, out._data),
            out._size,
            (x,),
            (out,),
        )

    def argsort(self, x: Tensor, axis: int, descending: bool, out: Tensor) -> None:
        self._launch(
            lambda: ew.argsort(x._data, axis, descending, out._data),
            out._size * max(1, out._size.bit_length()),
            (x,),
            (out,),
        )

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        self._launch(
            lambda: nn.gather(x._data, axis, index._data, out._data), out._size, (x, index), (out,)
        )

    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        self._launch(
            lambda: nn.scatter(x._data, axis, index._data, arr(src), out._data),
            out._size + index._size,
            (x, index, src),
            (out,),
        )

    def scatter_reduce(
        self, op: str, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        self._launch(
            lambda: nn.scatter_reduce(op, x._data, axis, index._data, arr(src), out._data),
            out._size + index._size,
            (x, index, src),
            (out,),
        )

    # -- image filters ----------------------------------------------------------------------------
    def depthwise(self, x: Tensor, kernel: np.ndarray[Any, Any], out: Tensor) -> None:
        # Fused: edge padding and a shifted-slice correlation per plane, instead of the
        # composition's narrow/concat padding and im2col convolution.
        self._launch(
            lambda: img.depthwise_replicate(x._data, kernel, out._data),
            out._size * kernel.size,
            (x,),
            (out,),
        )

    def separable_filter(
        self, x: Tensor, col: np.ndarray[Any, Any], row: np.ndarray[Any, Any], out: Tensor
    ) -> None:
        self._launch(
            lambda: img.separable_filter(x._data, col, row, out._data),
            out._size * (col.size + row.size),
            (x,),
            (out,),
        )

    def sobel_magnitude(self, x: Tensor, out: Tensor) -> None:
        self._launch(lambda: img.sobel_magnitude(x._data, out._data), out._size * 16, (x,), (out,))

    def grayscale(self, x: Tensor, weights: np.ndarray[Any, Any], out: Tensor) -> None:
        self._launch(
            lambda: img.grayscale(x._data, weights, out._data),
            out._size * 2 * weights.size,
            (x,),
            (out,),
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
        cost = out._size * weight._size // max(1, weight._shape[0])
        self._launch(
            lambda: nn.conv2d(
                x._data, weight._data, arr(bias), out._data, stride, padding, dilation, groups
            ),
            cost,
            (x, weight, bias),
            (out,),
        )

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
        cost = q._size * k._shape[2] * 2
        self._launch(
            lambda: nn.attention(
                q._data, k._data, v._data, arr(mask), out._data, scale, causal, accel=JIT
            ),
            cost,
            (q, k, v, mask),
            (out,),
        )

    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        self._launch(
            lambda: nn.softmax(x._data, axis, out._data, log, accel=JIT), 4 * x._size, (x,), (out,)
        )

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self._launch(
            lambda: nn.layer_norm(x._data, arr(weight), arr(bias), eps, out._data, accel=JIT),
            4 * x._size,
            (x, weight, bias),
            (out,),
        )

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self._launch(
            lambda: nn.rms_norm(x._data, arr(weight), eps, out._data, accel=JIT),
            3 * x._size,
            (x, weight),
            (out,),
        )

    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        self._launch(
            lambda: nn.cross_entropy(
                logits._data, targets._data, reduction, loss._data, probs._data
            ),
            4 * logits._size,
            (logits, targets),
            (loss, probs),
        )

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        self._launch(
            lambda: nn.embedding(indices._data, weight._data, out._data),
            out._size,
            (indices, weight),
            (out,),
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
        self._launch(
            lambda: nn.adam_update(
                param._data, grad._data, m._data, v._data, lr, beta1, beta2, eps, step, weight_decay
            ),
            8 * param._size,
            (param, grad, m, v),
            (param, m, v),
        )
