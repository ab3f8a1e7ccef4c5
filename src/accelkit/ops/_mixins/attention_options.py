"""Attention's options and rotary embedding from caller-supplied tables.

``attention`` with any of ``causal_alignment="top_left"``, ``window``, ``key_lengths``,
``softcap`` or ``return_weights`` runs the composition here (grouped-head matmuls, a mask built
from the shapes and the key lengths, softmax) on the device; without them it runs the backend's
attention kernel. ``apply_rotary`` rotates pairs of features by angles whose cos/sin tables the
caller supplies (Hugging Face's ``apply_rotary_pos_emb``), in the rotate-half or the interleaved
(GPT-J) layout, over all of the head dimension or its first ``rotary_dim`` features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from accelkit._core.shapes import broadcast_shapes
from accelkit._core.validation import (
    check_float,
    check_float_param,
    check_index,
    check_int,
    check_same_dtype,
    check_tensor,
)
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.ops.tensor_ops import TensorOps

__all__ = [
    "ATTENTION_LAYOUTS",
    "CAUSAL_ALIGNMENTS",
    "AttentionOptions",
    "AttentionOptionsOps",
    "check_attention_layout",
    "check_attention_options",
]

#: ``bottom_right``: the last query sees the last key (query i sees keys ``j <= i + Skv - Sq``,
#: what a KV cache needs; the default). ``top_left``: query i sees keys ``j <= i``.
CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")

#: ``bhsd``: q [B, H, Sq, D] (head-major; the default). ``bshd``: q [B, Sq, H, D]
#: (sequence-major: a projection's output reshaped to heads).
ATTENTION_LAYOUTS = ("bhsd", "bshd")


def check_attention_layout(layout: object) -> bool:
    """Whether ``layout`` is ``"bshd"`` (``"bhsd"`` gives False; anything else is refused)."""
    if isinstance(layout, str) and layout in ATTENTION_LAYOUTS:
        return layout == "bshd"
    raise InvalidArgumentError(
        f"attention: layout must be one of {', '.join(ATTENTION_LAYOUTS)}; got {layout!r}"
    )


@dataclass(frozen=True)
class AttentionOptions:
    """attention's options beyond the kernel's, validated."""

    causal_alignment: str = "bottom_right"
    window: int | None = None
    key_lengths: Tensor | None = None
    softcap: float | None = None
    return_weights: bool = False

    @property
    def default(self) -> bool:
        return (
            self.causal_alignment == "bottom_right"
            and self.window is None
            and self.key_lengths is None
            and self.softcap is None
            and not self.return_weights
        )


def check_attention_options(
    backend: ComputeBackend,
    batch: int,
    causal: bool,
    causal_alignment: str,
    window: int | None,
    key_lengths: Tensor | None,
    softcap: float | None,
    return_weights: bool,
) -> AttentionOptions:
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise InvalidArgumentError(
            f"attention: causal_alignment must be one of {', '.join(CAUSAL_ALIGNMENTS)}; got"
            f" {causal_alignment!r}"
        )
    if window is not None:
        window = check_int(window, "window", minimum=1)
        if not causal:
            raise InvalidArgumentError(
                "attention: a sliding window needs causal=True (it counts keys back from each"
                " query's own position)"
            )
    if key_lengths is not None:
        check_tensor(backend, key_lengths, "key_lengths")
        check_index(key_lengths, "attention", "key_lengths")
        if key_lengths._shape != (batch,):
            raise InvalidArgumentError(
                f"attention: key_lengths must be [{batch}] (one length per sequence); got"
                f" {key_lengths._shape}"
            )
    cap = None
    if softcap is not None:
        cap = check_float_param(softcap, "softcap", positive=True)
    if not isinstance(return_weights, bool):
        raise InvalidArgumentError(
            f"attention: return_weights must be a bool; got {return_weights!r}"
        )
    return AttentionOptions(causal_alignment, window, key_lengths, cap, return_weights)


class AttentionOptionsOps(OpsBase[TensorKernels]):
    """The attention composition and ``apply_rotary`` (see the module docstring)."""

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps

    def _attention_composed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: float,
        causal: bool,
        mask: Tensor | None,
        opts: AttentionOptions,
    ) -> Tensor | tuple[Tensor, Tensor]:
        ops, f = self._ops(), self.backend.tensor_factory
        b, h, sq, d = q._shape
        _, hk, sk, dv = v._shape
        g = h // hk
        if sk == 0:  # no key at all: every query gets zeros
            zeros = f.zeros((b, h, sq, dv), q._dtype)
            return (zeros, f.zeros((b, h, sq, 0), q._dtype)) if opts.return_weights else zeros
        work = DType.F64 if q._dtype is DType.F64 else DType.F32
        qw, kw, vw = (t if t._dtype is work else ops.cast(t, work) for t in (q, k, v))
        q5 = ops.reshape(qw, (b, hk, g, sq, d))
        k5 = ops.reshape(kw, (b, hk, 1, sk, d))
        scores = ops.mul(ops.matmul(q5, ops.transpose(k5, -2, -1)), scale)
        scores = ops.reshape(scores, (b, h, sq, sk))
        if opts.softcap is not None:
            scores = ops.mul(ops.tanh(ops.div(scores, opts.softcap)), opts.softcap)
        visible: Tensor | None = None
        if causal:
            offset = sk - sq if opts.causal_alignment == "bottom_right" else 0
            pos = np.arange(sq)[:, None] + offset
            keys = np.arange(sk)[None, :]
            allowed = keys <= pos
            if opts.window is not None:  # a window longer than both sequences hides nothing
                allowed &= keys > pos - min(opts.window, sq + sk + 1)
            visible = f.from_host(allowed, DType.BOOL)
        if opts.key_lengths is not None:
            lengths = opts.key_lengths
            if lengths._dtype is not DType.I64:
                lengths = ops.cast(lengths, DType.I64)
            # embedding() of 0..sk checks each length's range (reported when awaited).
            table = ops.reshape(f.arange(sk + 1, dtype=DType.I64), (sk + 1, 1))
            lengths = ops.embedding(lengths, table)  # [b, 1]
            inside = ops.lt(ops.reshape(f.arange(sk, dtype=DType.I64), (1, sk)), lengths)
            inside = ops.reshape(inside, (b, 1, 1, sk))
            visible = inside if visible is None else ops.bitwise_and(visible, inside)
        if mask is not None:
            if mask._dtype is DType.BOOL:
                visible = mask if visible is None else ops.bitwise_and(visible, mask)
            else:
                scores = ops.add(scores, mask if mask._dtype is work else ops.cast(mask, work))
        if visible is not None:
            scores = ops.where(visible, scores, float("-inf"))
        probs = ops.softmax(scores, -1)
        if visible is not None or mask is not None:
            # A query that sees no key gets zeros (its softmax is 0/0); NaN scores stay NaN.
            sees = ops.ne(ops.max(scores, -1, keepdims=True), float("-inf"))
            probs = ops.where(sees, probs, 0.0)
        out = ops.matmul(
            ops.reshape(probs, (b, hk, g, sq, sk)), ops.reshape(vw, (b, hk, 1, sk, dv))
        )
        out = ops.reshape(out, (b, h, sq, dv))
        if out._dtype is not q._dtype:
            out = ops.cast(out, q._dtype)
        if opts.return_weights:
            return out, (probs if probs._dtype is q._dtype else ops.cast(probs, q._dtype))
        return out

    def apply_rotary(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        *,
        interleaved: bool = False,
        rotary_dim: int | None = None,
    ) -> Tensor:
        """Rotate pairs of the last axis of ``x`` [..., S, D] by the angles whose ``cos`` and
        ``sin`` the caller gives ([S, R/2], or anything that broadcasts to ``x.shape[:-1] +
        (R/2,)``; R is ``rotary_dim``, all of D by default, even). Rotate-half layout (GPT-NeoX,
        Llama): pair i is features ``i`` and ``i + R/2``; ``interleaved`` (GPT-J): features
        ``2i`` and ``2i + 1``. ``out_a = a cos - b sin``, ``out_b = b cos + a sin``; features
        from R on pass through. F16/BF16 compute in F32."""
        b = self.backend
        for name, t in (("x", x), ("cos", cos), ("sin", sin)):
            check_tensor(b, t, name)
        check_float(x, "apply_rotary")
        check_same_dtype("apply_rotary", cos=cos, sin=sin)
        check_float(cos, "apply_rotary", "cos")
        if x.ndim < 2:
            raise InvalidArgumentError(f"apply_rotary: x must be [..., S, D]; got {x._shape}")
        if not isinstance(interleaved, bool):
            raise InvalidArgumentError(
                f"apply_rotary: interleaved must be a bool; got {interleaved!r}"
            )
        d = x._shape[-1]
        r = d if rotary_dim is None else check_int(rotary_dim, "rotary_dim", minimum=0)
        if r % 2 or r > d:
            raise InvalidArgumentError(
                f"apply_rotary: rotary_dim must be even and at most the head dimension {d}; got {r}"
            )
        half = r // 2
        want = (*x._shape[:-1], half)
        if (
            cos._shape != sin._shape
            or broadcast_shapes(cos._shape, want, "apply_rotary: cos") != want
        ):
            raise InvalidArgumentError(
                f"apply_rotary: cos and sin must have one shape that broadcasts to {want}; got"
                f" {cos._shape} and {sin._shape}"
            )
        ops = self._ops()
        if r == 0:
            return ops.where(b.tensor_factory.full((), True, DType.BOOL), x, x)
        work = DType.F64 if x._dtype is DType.F64 else DType.F32
        xw = x if x._dtype is work else ops.cast(x, work)
        c = cos if cos._dtype is work else ops.cast(cos, work)
        s = sin if sin._dtype is work else ops.cast(sin, work)
        last = x.ndim - 1
        if interleaved:
            a, bb = ops.narrow(xw, last, 0, half, 2), ops.narrow(xw, last, 1, half, 2)
        else:
            a, bb = ops.narrow(xw, last, 0, half), ops.narrow(xw, last, half, half)
        out_a = ops.sub(ops.mul(a, c), ops.mul(bb, s))
        out_b = ops.add(ops.mul(bb, c), ops.mul(a, s))
        if interleaved:
            rotated = ops.reshape(ops.stack([out_a, out_b], last + 1), (*x._shape[:-1], r))
        else:
            rotated = ops.concat([out_a, out_b], last)
        if r < d:
            rotated = ops.concat([rotated, ops.narrow(xw, last, r, d - r)], last)
        return rotated if rotated._dtype is x._dtype else ops.cast(rotated, x._dtype)
