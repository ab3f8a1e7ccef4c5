"""The example backend's TensorKernels: every kernel of :class:`accelkit.sdk.TensorKernels`.

The core has validated the arguments and allocated ``out`` (shape and dtype worked out) before a
kernel runs; a kernel only computes. The arithmetic is :mod:`accelkit.sdk.host`'s NumPy bodies (the
semantics the conformance suite checks); the shape kernels' copies are written here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accelkit import Tensor
from accelkit.errors import UnsupportedOperationError
from accelkit.sdk import Operand, TensorKernels
from accelkit.sdk import host as h
from accelkit_example.submit import ExampleComponent, array


class ExampleTensorKernels(ExampleComponent, TensorKernels):
    # -- elementwise ------------------------------------------------------------------------------
    def unary(self, op: str, x: Tensor, out: Tensor) -> None:
        self.launch(lambda: h.unary(op, array(x), array(out)), (x,), (out,))

    def binary(self, op: str, a: Operand, b: Operand, out: Tensor) -> None:
        self.launch(lambda: h.binary(op, array(a), array(b), array(out)), (a, b), (out,))

    def where(self, cond: Tensor, a: Operand, b: Operand, out: Tensor) -> None:
        self.launch(
            lambda: h.where(array(cond), array(a), array(b), array(out)), (cond, a, b), (out,)
        )

    def cast(self, x: Tensor, out: Tensor) -> None:
        self.launch(lambda: h.cast_into(array(x), array(out)), (x,), (out,))

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
        def run() -> None:
            h.gemm(array(a), array(b), array(c), array(out), trans_a, trans_b, alpha, beta)

        self.launch(run, (a, b, c), (out,))

    def matmul(self, a: Tensor, b: Tensor, out: Tensor) -> None:
        self.launch(lambda: h.matmul(array(a), array(b), array(out)), (a, b), (out,))

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
        self.launch(
            lambda: h.linear(array(x), array(weight), array(bias), array(out)),
            (x, weight, bias),
            (out,),
        )

    # -- reductions -------------------------------------------------------------------------------
    def reduce(
        self, op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Tensor
    ) -> None:
        self.launch(lambda: h.reduce(op, array(x), axes, keepdims, array(out)), (x,), (out,))

    # -- shape ------------------------------------------------------------------------------------
    def permute(self, x: Tensor, axes: tuple[int, ...], out: Tensor) -> None:
        self.launch(lambda: np.copyto(array(out), np.transpose(array(x), axes)), (x,), (out,))

    def concat(self, tensors: list[Tensor], axis: int, out: Tensor) -> None:
        def run() -> None:
            np.concatenate([array(t) for t in tensors], axis=axis, out=array(out))

        self.launch(run, tensors, (out,))

    def narrow(self, x: Tensor, axis: int, start: int, out: Tensor) -> None:
        def run() -> None:
            index: list[Any] = [slice(None)] * x.ndim
            index[axis] = slice(start, start + out.shape[axis])
            np.copyto(array(out), array(x)[tuple(index)])

        self.launch(run, (x,), (out,))

    def gather(self, x: Tensor, axis: int, index: Tensor, out: Tensor) -> None:
        # A bad index raises on the stream's worker; the caller sees it when it awaits a result.
        self.launch(lambda: h.gather(array(x), axis, array(index), array(out)), (x, index), (out,))

    def scatter(
        self, x: Tensor, axis: int, index: Tensor, src: Tensor | int | float, out: Tensor
    ) -> None:
        def run() -> None:
            h.scatter(array(x), axis, array(index), array(src), array(out))

        self.launch(run, (x, index, src), (out,))

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
        def run() -> None:
            h.conv2d(
                array(x), array(weight), array(bias), array(out), stride, padding, dilation, groups
            )

        self.launch(run, (x, weight, bias), (out,))

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
        def run() -> None:
            h.attention(array(q), array(k), array(v), array(mask), array(out), scale, causal)

        self.launch(run, (q, k, v, mask), (out,))

    def attention_bshd(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None:
        """The optional sequence-major attention (q [B, Sq, H, D], out [B, Sq, H, Dv]): the
        host body on transposed views. A masked call is declined before anything is queued,
        to show the contract: the core then permutes and runs :meth:`attention`."""
        if mask is not None:
            raise UnsupportedOperationError("the example's sequence-major attention takes no mask")

        def run() -> None:
            heads = (0, 2, 1, 3)
            o = array(out)
            res = np.empty(o.transpose(heads).shape, o.dtype)
            qa, ka, va = (array(t).transpose(heads) for t in (q, k, v))
            h.attention(qa, ka, va, None, res, scale, causal)
            o[...] = res.transpose(heads)

        self.launch(run, (q, k, v), (out,))

    def softmax(self, x: Tensor, axis: int, out: Tensor, log: bool) -> None:
        self.launch(lambda: h.softmax(array(x), axis, array(out), log), (x,), (out,))

    def layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None:
        self.launch(
            lambda: h.layer_norm(array(x), array(weight), array(bias), eps, array(out)),
            (x, weight, bias),
            (out,),
        )

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None:
        self.launch(
            lambda: h.rms_norm(array(x), array(weight), eps, array(out)), (x, weight), (out,)
        )

    def cross_entropy(
        self, logits: Tensor, targets: Tensor, reduction: str, loss: Tensor, probs: Tensor
    ) -> None:
        def run() -> None:
            h.cross_entropy(array(logits), array(targets), reduction, array(loss), array(probs))

        self.launch(run, (logits, targets), (loss, probs))

    def embedding(self, indices: Tensor, weight: Tensor, out: Tensor) -> None:
        self.launch(
            lambda: h.embedding(array(indices), array(weight), array(out)),
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
        def run() -> None:
            h.adam_update(
                array(param), array(grad), array(m), array(v),
                lr, beta1, beta2, eps, step, weight_decay,
            )  # fmt: skip

        self.launch(run, (param, grad, m, v), (param, m, v))
