"""Neural-network operations: conv2d, attention, softmax, norms, losses, embedding, Adam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

from accelkit._core.kernel_validation import check_norm
from accelkit._core.shapes import broadcast_shapes, conv2d_output_hw
from accelkit._core.validation import (
    check_axis,
    check_float,
    check_float_param,
    check_index,
    check_int,
    check_same_dtype,
    check_tensor,
    pair,
)
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.ops._mixins.attention_options import (
    check_attention_layout,
    check_attention_options,
)
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import FusedKernels, TensorKernels
from accelkit.tensor import Tensor

__all__ = ["NNOps", "padding_sides"]

PairArg = int | tuple[int, int]
#: The permutation between sequence-major [B, S, H, D] and head-major [B, H, S, D] (its own
#: inverse).
_HEADS = (0, 2, 1, 3)
PaddingArg = int | tuple[int, int] | tuple[tuple[int, int], tuple[int, int]]


def padding_sides(padding: object, name: str = "padding") -> tuple[tuple[int, int], ...]:
    """``((top, bottom), (left, right))`` from an int, a pair, or a pair of pairs."""
    if (
        isinstance(padding, Sequence)
        and not isinstance(padding, str)
        and len(padding) == 2
        and all(isinstance(v, Sequence) and not isinstance(v, str) for v in padding)
    ):
        return tuple(pair(v, f"{name}[{i}]", minimum=0) for i, v in enumerate(padding))
    ph, pw = pair(padding, name, minimum=0)
    return ((ph, ph), (pw, pw))


class NNOps(OpsBase[TensorKernels]):
    def conv2d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        *,
        stride: PairArg = 1,
        padding: PaddingArg = 0,
        dilation: PairArg = 1,
        groups: int = 1,
    ) -> Tensor:
        """2-d cross-correlation, NCHW: ``x`` [N, C, H, W], ``weight`` [O, C/groups, KH, KW],
        ``bias`` [O]; zero padding: an int, ``(ph, pw)``, or per side ``((top, bottom), (left,
        right))``. Output [N, O, OH, OW]. ``groups == C`` with ``weight`` [C*m, 1, KH, KW] is
        the depthwise form."""
        b = self.backend
        check_tensor(b, x)
        check_tensor(b, weight, "weight")
        check_float(x, "conv2d")
        dt = check_same_dtype("conv2d", x=x, weight=weight, bias=bias)
        if x.ndim != 4 or weight.ndim != 4:
            raise InvalidArgumentError(
                f"conv2d: x must be [N, C, H, W] and weight [O, C/groups, KH, KW]; got x"
                f" {x._shape} and weight {weight._shape}"
            )
        s = pair(stride, "stride", minimum=1)
        sides = padding_sides(padding)
        (top, bottom), (left, right) = sides
        p = (top, left)
        d = pair(dilation, "dilation", minimum=1)
        g = check_int(groups, "groups", minimum=1)
        n, c, h, w = x._shape
        o, cg, kh, kw = weight._shape
        if c % g or o % g:
            raise InvalidArgumentError(
                f"conv2d: groups={g} must divide both input channels ({c}) and output channels ({o})"
            )
        if cg != c // g:
            raise InvalidArgumentError(
                f"conv2d: weight {weight._shape} has {cg} input channels per group; x has {c}"
                f" channels in {g} group(s), so {c // g} are expected"
            )
        if bias is not None:
            check_tensor(b, bias, "bias")
            if bias._shape != (o,):
                raise InvalidArgumentError(f"conv2d: bias must be [{o}]; got {bias._shape}")
        if top == bottom and left == right:
            oh, ow = conv2d_output_hw(h, w, kh, kw, s, p, d)
        else:
            # Asymmetric: the output of the padded input, then the explicit zero padding.
            oh, ow = conv2d_output_hw(h + top + bottom, w + left + right, kh, kw, s, (0, 0), d)
            x = self.pad(x, [(0, 0), (0, 0), (top, bottom), (left, right)])  # type: ignore[attr-defined]
            p = (0, 0)
        out = self._empty((n, o, oh, ow), dt)
        self.kernels.conv2d(x, weight, bias, out, s, p, d, g)
        return out

    @overload
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = ...,
        causal: bool = ...,
        mask: Tensor | None = ...,
        causal_alignment: str = ...,
        window: int | None = ...,
        key_lengths: Tensor | None = ...,
        softcap: float | None = ...,
        layout: str = ...,
        return_weights: Literal[False] = ...,
    ) -> Tensor: ...

    @overload
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = ...,
        causal: bool = ...,
        mask: Tensor | None = ...,
        causal_alignment: str = ...,
        window: int | None = ...,
        key_lengths: Tensor | None = ...,
        softcap: float | None = ...,
        layout: str = ...,
        return_weights: Literal[True],
    ) -> tuple[Tensor, Tensor]: ...

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
        causal_alignment: str = "bottom_right",
        window: int | None = None,
        key_lengths: Tensor | None = None,
        softcap: float | None = None,
        layout: str = "bhsd",
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``.

        ``q`` [B, H, Sq, D]; ``k`` [B, Hkv, Skv, D] and ``v`` [B, Hkv, Skv, Dv] with ``H`` a
        multiple of ``Hkv`` (grouped KV heads: query head h reads KV head ``h // (H // Hkv)``).
        ``scale`` defaults to ``1/sqrt(D)``. ``causal`` masks future keys; by default it aligns
        the last query with the last key (``causal_alignment="bottom_right"``: query i sees keys
        ``j <= i + Skv - Sq``, as a KV cache needs); ``"top_left"`` lets query i see keys
        ``j <= i``. ``mask`` broadcasts to [B, H, Sq, Skv]: BOOL keeps True positions, a float
        mask is added to the scores. A query that sees no key gets zeros. Output [B, H, Sq, Dv].

        Options (each runs a composition of TensorOps instead of the backend's kernel):
        ``window`` (with ``causal``) lets each query see only the ``window`` most recent keys up
        to its own position; ``key_lengths`` [B] (integers in ``0..Skv``) hides keys from
        position ``key_lengths[b]`` on in a padded batch; ``softcap`` bounds the scores to
        ``softcap * tanh(scores / softcap)`` before masking (Gemma 2); ``return_weights`` returns
        ``(out, weights)`` with the softmax weights [B, H, Sq, Skv].

        ``layout="bshd"`` takes and returns sequence-major tensors instead: ``q`` [B, Sq, H, D],
        ``k`` [B, Skv, Hkv, D], ``v`` [B, Skv, Hkv, Dv], output [B, Sq, H, Dv] (JAX's and
        FlashAttention's order; ``mask`` and the weights keep the scores' [B, H, Sq, Skv]).
        It is what a projection's output reshaped to heads already is, so a transformer block
        needs no permute before or after attention: a backend whose kernels read that layout
        in place (:meth:`~accelkit.sdk.TensorKernels.attention_bshd`) runs no copy at all;
        elsewhere the core permutes around the head-major kernel (the same result).
        """
        b = self.backend
        bshd = check_attention_layout(layout)
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_tensor(b, t, name)
            if t.ndim != 4:
                axes = "batch, seq, heads, head_dim" if bshd else "batch, heads, seq, head_dim"
                raise InvalidArgumentError(f"attention: {name} must be [{axes}]; got {t._shape}")
        check_float(q, "attention", "q")
        dt = check_same_dtype("attention", q=q, k=k, v=v)
        if bshd:
            bq, sq, h, dq = q._shape
            bk, sk, hk, dk = k._shape
            bv, sv, hv, dv = v._shape
        else:
            bq, h, sq, dq = q._shape
            bk, hk, sk, dk = k._shape
            bv, hv, sv, dv = v._shape
        if not (bq == bk == bv):
            raise InvalidArgumentError(f"attention: batch sizes differ: q {bq}, k {bk}, v {bv}")
        if dq != dk:
            raise InvalidArgumentError(f"attention: q head_dim {dq} != k head_dim {dk}")
        if (hk, sk) != (hv, sv):
            raise InvalidArgumentError(
                f"attention: k {k._shape} and v {v._shape} must share heads and sequence length"
            )
        if hk == 0 or h % hk:
            raise InvalidArgumentError(
                f"attention: q has {h} heads, which is not a multiple of k/v's {hk} heads"
            )
        if scale is None:
            sc = 1.0 / dq**0.5 if dq else 1.0
        else:
            sc = check_float_param(scale, "scale", finite=True)
        if mask is not None:
            check_tensor(b, mask, "mask")
            target = (bq, h, sq, sk)
            if broadcast_shapes(mask._shape, target, "attention: mask and scores") != target:
                raise InvalidArgumentError(
                    f"attention: mask {mask._shape} does not broadcast to the scores {target}"
                )
            if mask._dtype is not DType.BOOL and not mask._dtype.is_floating:
                raise InvalidArgumentError(
                    f"attention: mask must be bool or floating; got {mask._dtype.value}"
                )
        causal = bool(causal)
        opts = check_attention_options(
            b, bq, causal, causal_alignment, window, key_lengths, softcap, return_weights
        )
        if bshd:
            kernels: TensorKernels | FusedKernels = self.kernels  # KernelOps runs this body too
            if opts.default and (
                kernels.overrides("attention_bshd")
                if isinstance(kernels, TensorKernels)
                else kernels.has_attention_bshd
            ):
                out = self._empty((bq, sq, h, dv), dt)
                try:
                    kernels.attention_bshd(q, k, v, mask, out, sc, causal)
                    return out
                except UnsupportedOperationError:
                    pass  # declined before enqueuing anything: the permutes below
            # The head-major kernel between permutes (the result is the same; three copies
            # in, one out), the checks above standing for both.
            permute = b.tensor_ops.permute
            q, k, v = permute(q, _HEADS), permute(k, _HEADS), permute(v, _HEADS)
        res: Tensor | tuple[Tensor, Tensor]
        if not opts.default:
            res = self._attention_composed(q, k, v, sc, causal, mask, opts)  # type: ignore[attr-defined]
        else:
            res = self._empty((bq, h, sq, dv), dt)
            self.kernels.attention(q, k, v, mask, res, sc, causal)
        if not bshd:
            return res
        if isinstance(res, tuple):  # (the weights keep the scores' layout)
            return b.tensor_ops.permute(res[0], _HEADS), res[1]
        return b.tensor_ops.permute(res, _HEADS)

    def softmax(self, x: Tensor, axis: int = -1) -> Tensor:
        """``exp(x) / sum(exp(x))`` along ``axis`` (computed stably)."""
        return self._softmax(x, axis, log=False)

    def log_softmax(self, x: Tensor, axis: int = -1) -> Tensor:
        return self._softmax(x, axis, log=True)

    def _softmax(self, x: Tensor, axis: int, *, log: bool) -> Tensor:
        check_tensor(self.backend, x)
        ax = check_axis(axis, x.ndim)
        if x.ndim == 0:  # over the one element of a 0-d tensor (kernels take an axis)
            ops = self.backend.tensor_ops
            return ops.reshape(self._softmax(ops.reshape(x, (1,)), 0, log=log), ())
        dt = x._dtype if x._dtype.is_floating else DType.F32
        out = self._empty(x._shape, dt)
        self.kernels.softmax(x, ax, out, log)
        return out

    def layer_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """Normalize over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias``."""
        # Validated before allocating, so that a refusal allocates nothing.
        eps = check_norm(self.backend, "layer_norm", x, eps, weight=weight, bias=bias)
        out = self._empty(x._shape, x._dtype)
        self.kernels.layer_norm(x, weight, bias, eps, out)
        return out

    def rms_norm(self, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""
        eps = check_norm(self.backend, "rms_norm", x, eps, weight=weight)
        out = self._empty(x._shape, x._dtype)
        self.kernels.rms_norm(x, weight, eps, out)
        return out

    def cross_entropy(
        self,
        logits: Tensor,
        targets: Tensor,
        reduction: str = "mean",
        *,
        weight: Tensor | None = None,
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
    ) -> tuple[Tensor, Tensor]:
        """Softmax cross-entropy: ``logits`` [N, C], ``targets`` [N] class indices.

        Returns ``(loss, probabilities)``: the loss is a 0-d tensor for ``reduction`` "mean" or
        "sum", [N] for "none"; probabilities are ``softmax(logits)`` [N, C] (without the options
        below, the gradient with respect to the logits is ``probabilities - one_hot(targets)``).
        A target outside ``0..C-1`` is reported when the result is awaited.

        PyTorch's options: class ``weight`` [C]; targets equal to ``ignore_index`` count for
        nothing (``None``, the default, ignores none: unlike PyTorch's -100, so that a stray
        -100 is an error); ``label_smoothing`` in [0, 1] mixes in the uniform distribution.
        "mean" divides by the summed weights of the counted targets (their number without
        weights), which is NaN when every target is ignored, as in PyTorch. With any option the
        loss is a composition of TensorOps (log_softmax, gather, sums).
        """
        b = self.backend
        check_tensor(b, logits, "logits")
        check_tensor(b, targets, "targets")
        check_float(logits, "cross_entropy", "logits")
        check_index(targets, "cross_entropy", "targets")
        if logits.ndim != 2 or targets._shape != logits._shape[:1]:
            raise InvalidArgumentError(
                f"cross_entropy: logits must be [N, C] and targets [N]; got logits"
                f" {logits._shape} and targets {targets._shape}"
            )
        if reduction not in ("mean", "sum", "none"):
            raise InvalidArgumentError(
                f"cross_entropy: reduction must be 'mean', 'sum' or 'none'; got {reduction!r}"
            )
        if weight is not None or ignore_index is not None or label_smoothing != 0.0:
            return self._cross_entropy_composed(  # type: ignore[attr-defined,no-any-return]
                logits,
                targets,
                weight=weight,
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                reduction=reduction,
            )
        loss = self._empty(() if reduction != "none" else logits._shape[:1], logits._dtype)
        probs = self._empty(logits._shape, logits._dtype)
        self.kernels.cross_entropy(logits, targets, reduction, loss, probs)
        return loss, probs

    def embedding(self, indices: Tensor, weight: Tensor) -> Tensor:
        """Rows of ``weight`` [V, D] picked by integer ``indices`` (any shape) -> [..., D].

        An index outside ``0..V-1`` is reported when the result is awaited.
        """
        check_tensor(self.backend, indices, "indices")
        check_tensor(self.backend, weight, "weight")
        check_index(indices, "embedding", "indices")
        if weight.ndim != 2:
            raise InvalidArgumentError(f"embedding: weight must be [V, D]; got {weight._shape}")
        out = self._empty((*indices._shape, weight._shape[1]), weight._dtype)
        self.kernels.embedding(indices, weight, out)
        return out

    def adam_update(
        self,
        param: Tensor,
        grad: Tensor,
        m: Tensor,
        v: Tensor,
        *,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        step: int,
        weight_decay: float = 0.0,
    ) -> Tensor:
        """One AdamW step, in place on ``param``, ``m`` and ``v``; returns ``param``.

        ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``; ``param -= lr * (m_hat /
        (sqrt(v_hat) + eps) + weight_decay * param)`` with bias-corrected ``m_hat``, ``v_hat``
        for ``step`` (counted from 1). Weight decay is decoupled (AdamW).
        """
        b = self.backend
        for name, t in (("param", param), ("grad", grad), ("m", m), ("v", v)):
            check_tensor(b, t, name)
            if t._shape != param._shape:
                raise InvalidArgumentError(
                    f"adam_update: {name} has shape {t._shape}, param has {param._shape}"
                )
        check_float(param, "adam_update", "param")
        check_same_dtype("adam_update", param=param, grad=grad, m=m, v=v)
        if len({id(param._buffer), id(grad._buffer), id(m._buffer), id(v._buffer)}) != 4:
            raise InvalidArgumentError("adam_update: param, grad, m and v must be distinct buffers")
        lr = check_float_param(lr, "lr", finite=True)
        if lr < 0:  # as PyTorch's optimizers: it would climb the loss
            raise InvalidArgumentError(f"adam_update: lr must be >= 0; got {lr}")
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= check_float_param(beta, name) < 1.0:
                raise InvalidArgumentError(f"adam_update: {name} must be in [0, 1); got {beta}")
        eps = check_float_param(eps, "eps", positive=True)
        step = check_int(step, "step", minimum=1)
        weight_decay = check_float_param(weight_decay, "weight_decay", finite=True)
        if weight_decay < 0:
            raise InvalidArgumentError(
                f"adam_update: weight_decay must be >= 0; got {weight_decay}"
            )
        self.kernels.adam_update(
            param, grad, m, v, lr, float(beta1), float(beta2), eps, step, weight_decay
        )
        return param
