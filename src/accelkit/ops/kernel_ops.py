"""``KernelOps``: fused kernels for transformer inference, with compositions behind them.

``backend.kernel_ops`` is always present. Each of its twelve ops runs the backend's fused kernel
(:class:`accelkit.sdk.FusedKernels`) where the backend has one, and otherwise the core's
composition of TensorOps calls with the same contract (:mod:`accelkit.ops.composite`):

================ ============================================================
norms            rms_norm, rms_norm_residual, layer_norm
positions        rotary_embedding
attention        attention (grouped KV heads), paged_attention (block table)
activations      silu_mul, gelu
linear           linear, quantized_linear (GGML q8_0 and q4_0 blocks)
sampling         argmax, sample_token
================ ============================================================

A fused kernel exists to be faster (fewer launches, fewer temporaries), never to compute
something else. A fused kernel that refuses a call with
:class:`~accelkit.errors.UnsupportedOperationError` (a dtype it lacks, say) is retried as the
composition: a call that raises has changed nothing, so the retry is safe. Bad arguments raise the
same InvalidArgumentError on both routes and are not retried. Every call records its route
(:class:`accelkit.routes.Route`, the shape fallbacks are recorded in too) in ``last_route`` and
``routes`` and logs it at debug level on the ``accelkit.kernel_ops`` logger.

As on TensorOps, every public method is a *submission*: it validates its arguments (once for every
backend, with :mod:`accelkit._core.kernel_validation`, which the compositions share), allocates
the outputs, enqueues the work on the current stream and returns at once; a call that raises has
changed nothing. Errors that depend on tensor *values* (a block id or token id out of range) can
only be seen by the kernel; they are raised when the result is awaited. F16 and BF16 inputs are
computed in F32 and rounded once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from accelkit._core.kernel_validation import (
    GeluApproximation,
    SamplingParams,
    check_gelu,
    check_logits,
    check_norm,
    check_paged_attention,
    check_quantized_linear,
    check_rms_norm_residual,
    check_rotary,
    check_sampling,
    check_silu_mul,
)
from accelkit._core.op_names import KERNEL_OPS, KERNEL_OPS_IN_ORDER
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError, UnsupportedOperationError
from accelkit.ops import composite
from accelkit.ops._mixins.base import OpsBase
from accelkit.ops._mixins.linalg import LinalgOps
from accelkit.ops._mixins.nn import NNOps
from accelkit.quant import QuantFormat
from accelkit.routes import Route, RouteName
from accelkit.sdk.kernels import FusedKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.sdk.kernels import FusedKernels

__all__ = [
    "KERNEL_OPS",
    "KERNEL_OPS_IN_ORDER",
    "GeluApproximation",
    "KernelOps",
    "SamplingParams",
]

logger = logging.getLogger("accelkit.kernel_ops")
_T = TypeVar("_T")


class KernelOps(OpsBase[FusedKernels]):
    """A backend's KernelOps (see the module docstring).

    ``prefer="composed"`` always runs the compositions, e.g. to check a fused kernel against
    them (:meth:`composed` makes such a twin).
    """

    __slots__ = ("_fused", "last_route", "prefer", "routes")

    def __init__(
        self, backend: ComputeBackend, kernels: FusedKernels, prefer: RouteName = "fused"
    ) -> None:
        if prefer not in ("fused", "composed"):
            raise InvalidArgumentError(f"prefer must be 'fused' or 'composed'; got {prefer!r}")
        super().__init__(backend, kernels)
        self.prefer: RouteName = prefer
        self._fused = kernels.fused_ops if prefer == "fused" else frozenset()
        #: The route of the most recent successful call (None before the first).
        self.last_route: Route | None = None
        #: Calls per op and route: ``{"rms_norm": {"fused": 3, "composed": 0}}``.
        self.routes: dict[str, dict[RouteName, int]] = {}

    @property
    def ops(self) -> frozenset[str]:
        """The ops this backend runs as fused kernels (the rest run as compositions)."""
        return self.kernels.fused_ops

    def twin(self, prefer: RouteName = "fused") -> KernelOps:
        """The same ops over the same kernels with route records of their own (``routes``,
        ``last_route``); ``prefer="composed"`` always runs the compositions."""
        return KernelOps(self.backend, self.kernels, prefer=prefer)

    def composed(self) -> KernelOps:
        """A twin that always runs the compositions (its own route records)."""
        return self.twin("composed")

    def _run(self, op: str, fused: Callable[[], _T], composed: Callable[[], _T]) -> _T:
        if op not in self._fused:
            reason = (
                "prefer='composed'"
                if self.prefer == "composed"
                else f"{self.backend.name} has no fused {op}"
            )
        else:
            try:
                result = fused()
            except UnsupportedOperationError as exc:
                reason = f"the fused kernel refused: {exc}"
            else:
                self._record(op, "fused", f"{self.backend.name} fused {op}")
                return result
        result = composed()
        self._record(op, "composed", reason)
        return result

    def _record(self, op: str, route: RouteName, reason: str) -> None:
        self.last_route = Route(op=op, backend=self.backend.name, route=route, reason=reason)
        counts = self.routes.get(op)
        if counts is None:
            counts = self.routes[op] = {"fused": 0, "composed": 0}
        counts[route] += 1
        logger.debug("%s on %s: %s (%s)", op, self.backend.name, route, reason)

    def __repr__(self) -> str:
        fused = sorted(self.kernels.fused_ops)
        return f"<KernelOps of {self.backend.name}: fused {', '.join(fused) or 'none'}>"

    # -- norms ------------------------------------------------------------------------------------
    def rms_norm(self, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""

        def fused() -> Tensor:
            eps_ = check_norm(self.backend, "rms_norm", x, eps, weight=weight)
            out = self._empty(x._shape, x._dtype)
            self.kernels.rms_norm(x, weight, eps_, out)
            return out

        return self._run(
            "rms_norm", fused, lambda: composite.rms_norm(self.backend, x, weight, eps)
        )

    def rms_norm_residual(
        self, x: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6
    ) -> tuple[Tensor, Tensor]:
        """The pre-norm transformer step: ``summed = x + residual`` and ``normed =
        rms_norm(summed)``; returns ``(normed, summed)``.

        ``summed`` (in x's dtype) is the next layer's residual; ``normed`` is computed from it
        as stored, so the pair equals the two separate ops exactly.
        """

        def fused() -> tuple[Tensor, Tensor]:
            eps_ = check_rms_norm_residual(self.backend, x, residual, weight, eps)
            normed = self._empty(x._shape, x._dtype)
            summed = self._empty(x._shape, x._dtype)
            self.kernels.rms_norm_residual(x, residual, weight, eps_, normed, summed)
            return normed, summed

        return self._run(
            "rms_norm_residual", fused,
            lambda: composite.rms_norm_residual(self.backend, x, residual, weight, eps),
        )  # fmt: skip

    def layer_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis."""

        def fused() -> Tensor:
            eps_ = check_norm(self.backend, "layer_norm", x, eps, weight=weight, bias=bias)
            out = self._empty(x._shape, x._dtype)
            self.kernels.layer_norm(x, weight, bias, eps_, out)
            return out

        return self._run(
            "layer_norm", fused,
            lambda: composite.layer_norm(self.backend, x, weight, bias, eps),
        )  # fmt: skip

    # -- positions --------------------------------------------------------------------------------
    def rotary_embedding(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        base: float = 10000.0,
        offset: int = 0,
    ) -> Tensor:
        """Rotary position embedding, "rotate-half" convention (GPT-NeoX, Hugging Face Llama).

        ``x`` [batch, heads, seq, head_dim] with an even head_dim; the first and second halves of
        the head dimension form the pairs: ``out1 = x1 cos - x2 sin``, ``out2 = x2 cos + x1 sin``
        with angle ``position * base ** (-2i / head_dim)`` (:func:`rotary_inv_freq`). Token ``s``
        is at position ``offset + s``, or ``positions[s]`` (``positions[b, s]``) when given (I32
        or I64, [seq] or [batch, seq]). Output has x's shape and dtype.
        """

        def fused() -> Tensor:
            base_, offset_ = check_rotary(self.backend, x, positions, base, offset)
            out = self._empty(x._shape, x._dtype)
            self.kernels.rotary_embedding(x, positions, base_, offset_, out)
            return out

        return self._run(
            "rotary_embedding", fused,
            lambda: composite.rotary_embedding(self.backend, x, positions, base, offset),
        )  # fmt: skip

    # -- attention --------------------------------------------------------------------------------
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
    ) -> Tensor:
        """Scaled dot-product attention with TensorOps.attention's contract (grouped KV heads,
        ``causal`` aligned to the last key unless ``causal_alignment="top_left"``, bool or
        additive ``mask``, a sliding ``window``, ``key_lengths`` for a padded batch, logit
        ``softcap``, ``layout="bshd"`` for sequence-major q, k, v and output). The options
        have no fused kernel yet: a call using them runs the composition, and its route record
        says so. With ``layout="bshd"`` a fused kernel that reads the layout in place
        (``FusedKernels.attention_bshd``: CUDA's) runs alone; elsewhere the head-major one
        runs between permutes."""
        options = {
            "causal_alignment": causal_alignment, "window": window, "key_lengths": key_lengths,
            "softcap": softcap,
        }  # fmt: skip

        def fused() -> Tensor:
            if causal_alignment != "bottom_right" or any(
                v is not None for v in (window, key_lengths, softcap)
            ):
                used = ", ".join(k for k, v in options.items() if v not in (None, "bottom_right"))
                raise UnsupportedOperationError(f"no fused attention takes {used}")
            # One place for the checks: NNOps.attention's body needs only ``backend``,
            # ``_empty`` and ``kernels.attention``, which FusedKernels declares with
            # TensorKernels's signature.
            return NNOps.attention(  # type: ignore[call-overload,no-any-return]
                self, q, k, v, scale=scale, causal=causal, mask=mask, layout=layout
            )

        def composed() -> Tensor:
            return composite.attention(
                self.backend, q, k, v, scale=scale, causal=causal, mask=mask,
                causal_alignment=causal_alignment, window=window, key_lengths=key_lengths,
                softcap=softcap, layout=layout,
            )  # fmt: skip

        return self._run("attention", fused, composed)

    def paged_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        block_table: Tensor,
        context_lens: Tensor,
        scale: float | None = None,
    ) -> Tensor:
        """One decode step of attention over a paged KV cache (vLLM's layout).

        ``q`` [batch, heads, head_dim] is each sequence's newest query; ``k_cache`` and
        ``v_cache`` [num_blocks, block_size, kv_heads, head_dim] hold every sequence's keys and
        values in fixed-size blocks; ``block_table`` [batch, max_blocks] lists sequence b's
        blocks in order and ``context_lens`` [batch] its length, so its token ``t`` lives at
        ``cache[block_table[b, t // block_size], t % block_size]``. Query head h reads KV head
        ``h // (heads // kv_heads)``; ``scale`` defaults to ``1/sqrt(head_dim)``. Entries of
        ``block_table`` past a sequence's length are never read. A sequence of length 0 gets
        zeros. Output [batch, heads, head_dim].
        """
        args = (q, k_cache, v_cache, block_table, context_lens)

        def fused() -> Tensor:
            sc = check_paged_attention(self.backend, *args, scale)
            out = self._empty(q._shape, q._dtype)
            self.kernels.paged_attention(*args, sc, out)
            return out

        return self._run(
            "paged_attention", fused,
            lambda: composite.paged_attention(self.backend, *args, scale),
        )  # fmt: skip

    # -- activations ------------------------------------------------------------------------------
    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        """``silu(gate) * up`` (the SwiGLU feed-forward gate); same shapes and dtypes."""

        def fused() -> Tensor:
            check_silu_mul(self.backend, gate, up)
            out = self._empty(gate._shape, gate._dtype)
            self.kernels.silu_mul(gate, up, out)
            return out

        return self._run("silu_mul", fused, lambda: composite.silu_mul(self.backend, gate, up))

    def gelu(self, x: Tensor, approximate: GeluApproximation = "none") -> Tensor:
        """GELU: exact ``x * Phi(x)``, or with ``approximate="tanh"`` the tanh form."""

        def fused() -> Tensor:
            approx = check_gelu(self.backend, x, approximate)
            out = self._empty(x._shape, x._dtype)
            self.kernels.gelu(x, approx, out)
            return out

        return self._run("gelu", fused, lambda: composite.gelu(self.backend, x, approximate))

    # -- linear -----------------------------------------------------------------------------------
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ weight.T + bias`` with TensorOps.linear's contract (dtypes promote)."""
        # One place for the checks (see attention): LinalgOps.linear's body needs only
        # ``backend``, ``_empty`` and ``kernels.linear``.
        return self._run(
            "linear",
            lambda: LinalgOps.linear(self, x, weight, bias),  # type: ignore[arg-type]
            lambda: composite.linear(self.backend, x, weight, bias),
        )

    def quantized_linear(
        self,
        x: Tensor,
        qweight: Tensor,
        scales: Tensor,
        bias: Tensor | None = None,
        format: QuantFormat = "q8_0",
    ) -> Tensor:
        """``x @ dequantize(qweight, scales).T + bias`` for GGML block-quantized weights.

        ``x`` [..., in] floating (``in`` a multiple of 32); ``q8_0``: ``qweight`` I8 [out, in];
        ``q4_0``: ``qweight`` U8 [out, in/2], nibbles as described in :mod:`accelkit.quant`
        (which prepares such weights); ``scales`` F16 or F32 [out, in/32]; ``bias`` [out] of x's
        dtype. Output [..., out] of x's dtype. The weight is expanded in x's compute dtype (F32
        for F16/BF16) and never materialized whole where the backend can avoid it.
        """

        def fused() -> Tensor:
            fmt = check_quantized_linear(self.backend, x, qweight, scales, bias, format)
            out = self._empty((*x._shape[:-1], qweight._shape[0]), x._dtype)
            self.kernels.quantized_linear(x, qweight, scales, bias, fmt, out)
            return out

        return self._run(
            "quantized_linear", fused,
            lambda: composite.quantized_linear(self.backend, x, qweight, scales, bias, format),
        )  # fmt: skip

    # -- sampling ---------------------------------------------------------------------------------
    def argmax(self, logits: Tensor) -> Tensor:
        """Index of the largest logit per row (the first on ties): I64 [batch] (0-d for [vocab])."""

        def fused() -> Tensor:
            check_logits(self.backend, "argmax", logits)
            out = self._empty(logits._shape[:-1], DType.I64)
            self.kernels.argmax(logits, out)
            return out

        return self._run("argmax", fused, lambda: composite.argmax(self.backend, logits))

    def sample_token(
        self,
        logits: Tensor,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        previous_tokens: Tensor | None = None,
        seed: int | None = None,
    ) -> Tensor:
        """Draw one token per row: I64 [batch] (0-d for [vocab] logits).

        In order (as Hugging Face's logits processors): the repetition penalty (CTRL: a token in
        ``previous_tokens`` [batch, n] ([n] for 1-d logits; negative entries are padding) has a
        positive logit divided by the penalty and a negative one multiplied); then
        ``temperature`` 0 picks the argmax; otherwise logits are divided by the temperature,
        ``top_k`` > 0 keeps the k largest (ties at the boundary kept), ``top_p`` < 1 keeps the
        smallest set of most likely tokens whose probability reaches ``top_p``, and a token is
        drawn from the softmax of what is left with the Gumbel-max trick. The noise is
        ``tensor_factory.uniform((batch, vocab), seed=seed)``, so a seed gives the same tokens
        on every backend and every route (up to float rounding at exact ties); vary the seed per
        step. Logits must be finite or -inf, with at least one finite per row.
        """
        args = (logits, temperature, top_k, top_p, repetition_penalty, previous_tokens, seed)

        def fused() -> Tensor:
            params = check_sampling(
                self.backend, logits, previous_tokens, temperature, top_k, top_p,
                repetition_penalty, seed,
            )  # fmt: skip
            out = self._empty(logits._shape[:-1], DType.I64)
            self.kernels.sample_token(logits, previous_tokens, params, out)
            return out

        return self._run("sample_token", fused, lambda: composite.sample_token(self.backend, *args))
