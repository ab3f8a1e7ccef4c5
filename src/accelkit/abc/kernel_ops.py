"""``KernelOps``: optional fused kernels for transformer inference.

A backend's ``kernel_ops`` is None, or a :class:`KernelOps` holding six sub-interfaces, any of
which may be None where the backend has no fused kernel for that group:

============== ============================================================
norm_ops       rms_norm, rms_norm_residual, layer_norm
position_ops   rotary_embedding
attention_ops  attention (grouped KV heads), paged_attention (block table)
activation_ops silu_mul, gelu
linear_ops     linear, quantized_linear (GGML q8_0 and q4_0 blocks)
sampling_ops   argmax, sample_token
============== ============================================================

Every op has a composition of TensorOps calls with the same contract in
:mod:`accelkit._core.composite`; :class:`accelkit._core.dispatch.KernelDispatcher` runs the fused
kernel where the backend has one and the composition otherwise, and records which ran. A fused
kernel exists to be faster (fewer launches, fewer temporaries), never to compute something else.

As on TensorOps, every public method is a *submission*: it validates its arguments (once for every
backend, with :mod:`accelkit._core.kernel_validation`, which the compositions share), allocates
the outputs, enqueues the work on the current stream and returns at once; a call that raises has
changed nothing. Backends implement the ``_k_*`` hooks, which receive validated inputs and
allocated outputs and must enqueue work that writes the outputs in stream order. Errors that
depend on tensor *values* (a block id or token id out of range) can only be seen by the kernel;
they are raised when the result is awaited. F16 and BF16 inputs are computed in F32 and rounded
once.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

import numpy as np

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
from accelkit._core.op_names import KERNEL_OP_GROUPS, KERNEL_OPS
from accelkit._core.ops.base import OpsBase
from accelkit._core.ops.linalg import LinalgOps
from accelkit._core.ops.nn import NNOps
from accelkit.dtype import DType
from accelkit.quant import QuantFormat
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend

__all__ = [
    "GUMBEL_UNIFORM_MAX",
    "KERNEL_OPS",
    "KERNEL_OP_GROUPS",
    "ActivationOps",
    "AttentionOps",
    "GeluApproximation",
    "KernelOps",
    "LinearOps",
    "NormOps",
    "PositionOps",
    "SamplingOps",
    "SamplingParams",
    "rotary_inv_freq",
]

#: sample_token clamps its uniform noise to the largest float32 below 1, so that the Gumbel
#: transform ``-log(-log(u))`` stays finite.
GUMBEL_UNIFORM_MAX = float(np.nextafter(np.float32(1), np.float32(0)))


def rotary_inv_freq(head_dim: int, base: float) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
    """The rotary frequencies ``base ** (-2i / head_dim)`` for ``i < head_dim / 2`` (float64).

    Every implementation converts them to its compute dtype (F32, or F64 for F64 input) and
    takes angles as ``position * frequency`` in that dtype, as the Hugging Face Llama code does.
    """
    return 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


# -- the interfaces -------------------------------------------------------------------------------
class NormOps(OpsBase):
    """Normalizations over the last axis (same contracts as the TensorOps norms)."""

    def rms_norm(self, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""
        eps_ = check_norm(self.backend, "rms_norm", x, eps, weight=weight)
        out = self._empty(x._shape, x._dtype)
        self._k_rms_norm(x, weight, eps_, out)
        return out

    def rms_norm_residual(
        self, x: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6
    ) -> tuple[Tensor, Tensor]:
        """The pre-norm transformer step: ``summed = x + residual`` and ``normed =
        rms_norm(summed)``; returns ``(normed, summed)``.

        ``summed`` (in x's dtype) is the next layer's residual; ``normed`` is computed from it
        as stored, so the pair equals the two separate ops exactly.
        """
        eps_ = check_rms_norm_residual(self.backend, x, residual, weight, eps)
        normed = self._empty(x._shape, x._dtype)
        summed = self._empty(x._shape, x._dtype)
        self._k_rms_norm_residual(x, residual, weight, eps_, normed, summed)
        return normed, summed

    def layer_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis."""
        eps_ = check_norm(self.backend, "layer_norm", x, eps, weight=weight, bias=bias)
        out = self._empty(x._shape, x._dtype)
        self._k_layer_norm(x, weight, bias, eps_, out)
        return out

    @abstractmethod
    def _k_rms_norm(self, x: Tensor, weight: Tensor | None, eps: float, out: Tensor) -> None: ...

    @abstractmethod
    def _k_rms_norm_residual(
        self,
        x: Tensor,
        residual: Tensor,
        weight: Tensor | None,
        eps: float,
        normed: Tensor,
        summed: Tensor,
    ) -> None: ...

    @abstractmethod
    def _k_layer_norm(
        self, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out: Tensor
    ) -> None: ...


class PositionOps(OpsBase):
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
        base_, offset_ = check_rotary(self.backend, x, positions, base, offset)
        out = self._empty(x._shape, x._dtype)
        self._k_rotary_embedding(x, positions, base_, offset_, out)
        return out

    @abstractmethod
    def _k_rotary_embedding(
        self, x: Tensor, positions: Tensor | None, base: float, offset: int, out: Tensor
    ) -> None: ...


class AttentionOps(OpsBase):
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
    ) -> Tensor:
        """Scaled dot-product attention with TensorOps.attention's contract (grouped KV heads,
        ``causal`` aligned to the last key, bool or additive ``mask``).
        """
        # One place for the checks: NNOps.attention's body needs only ``backend``, ``_empty`` and
        # a ``_k_attention`` hook, which this class declares with NNOps's signature.
        return NNOps.attention(self, q, k, v, scale=scale, causal=causal, mask=mask)  # type: ignore[arg-type]

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
        sc = check_paged_attention(
            self.backend, q, k_cache, v_cache, block_table, context_lens, scale
        )
        out = self._empty(q._shape, q._dtype)
        self._k_paged_attention(q, k_cache, v_cache, block_table, context_lens, sc, out)
        return out

    @abstractmethod
    def _k_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        out: Tensor,
        scale: float,
        causal: bool,
    ) -> None: ...

    @abstractmethod
    def _k_paged_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        block_table: Tensor,
        context_lens: Tensor,
        scale: float,
        out: Tensor,
    ) -> None: ...


class ActivationOps(OpsBase):
    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        """``silu(gate) * up`` (the SwiGLU feed-forward gate); same shapes and dtypes."""
        check_silu_mul(self.backend, gate, up)
        out = self._empty(gate._shape, gate._dtype)
        self._k_silu_mul(gate, up, out)
        return out

    def gelu(self, x: Tensor, approximate: GeluApproximation = "none") -> Tensor:
        """GELU: exact ``x * Phi(x)``, or with ``approximate="tanh"`` the tanh form."""
        approx = check_gelu(self.backend, x, approximate)
        out = self._empty(x._shape, x._dtype)
        self._k_gelu(x, approx, out)
        return out

    @abstractmethod
    def _k_silu_mul(self, gate: Tensor, up: Tensor, out: Tensor) -> None: ...

    @abstractmethod
    def _k_gelu(self, x: Tensor, approximate: GeluApproximation, out: Tensor) -> None: ...


class LinearOps(OpsBase):
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ weight.T + bias`` with TensorOps.linear's contract (dtypes promote)."""
        # One place for the checks (see AttentionOps.attention): LinalgOps.linear's body needs
        # only ``backend``, ``_empty`` and the ``_k_linear`` hook declared here.
        return LinalgOps.linear(self, x, weight, bias)  # type: ignore[arg-type]

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
        fmt = check_quantized_linear(self.backend, x, qweight, scales, bias, format)
        out = self._empty((*x._shape[:-1], qweight._shape[0]), x._dtype)
        self._k_quantized_linear(x, qweight, scales, bias, fmt, out)
        return out

    @abstractmethod
    def _k_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None: ...

    @abstractmethod
    def _k_quantized_linear(
        self,
        x: Tensor,
        qweight: Tensor,
        scales: Tensor,
        bias: Tensor | None,
        format: QuantFormat,
        out: Tensor,
    ) -> None: ...


class SamplingOps(OpsBase):
    """Choosing the next token from logits [batch, vocab] (or [vocab])."""

    def argmax(self, logits: Tensor) -> Tensor:
        """Index of the largest logit per row (the first on ties): I64 [batch] (0-d for [vocab])."""
        check_logits(self.backend, "argmax", logits)
        out = self._empty(logits._shape[:-1], DType.I64)
        self._k_argmax(logits, out)
        return out

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
        params = check_sampling(
            self.backend, logits, previous_tokens, temperature, top_k, top_p,
            repetition_penalty, seed,
        )  # fmt: skip
        out = self._empty(logits._shape[:-1], DType.I64)
        self._k_sample_token(logits, previous_tokens, params, out)
        return out

    @abstractmethod
    def _k_argmax(self, logits: Tensor, out: Tensor) -> None: ...

    @abstractmethod
    def _k_sample_token(
        self, logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams, out: Tensor
    ) -> None: ...


class KernelOps:
    """A backend's fused kernels: six sub-interfaces, each an instance or None.

    A None sub-interface means the backend has no fused kernels for that group; callers that want
    the op regardless use :class:`accelkit._core.dispatch.KernelDispatcher`, which falls back to
    the TensorOps composition.
    """

    def __init__(
        self,
        backend: ComputeBackend,
        *,
        norm_ops: NormOps | None = None,
        position_ops: PositionOps | None = None,
        attention_ops: AttentionOps | None = None,
        activation_ops: ActivationOps | None = None,
        linear_ops: LinearOps | None = None,
        sampling_ops: SamplingOps | None = None,
    ) -> None:
        self.backend = backend
        self.norm_ops = norm_ops
        self.position_ops = position_ops
        self.attention_ops = attention_ops
        self.activation_ops = activation_ops
        self.linear_ops = linear_ops
        self.sampling_ops = sampling_ops

    @property
    def ops(self) -> frozenset[str]:
        """Names of the ops this backend runs as fused kernels (its sub-interfaces' ops)."""
        return frozenset(
            op
            for group, names in KERNEL_OP_GROUPS.items()
            if getattr(self, group) is not None
            for op in names
        )

    def __repr__(self) -> str:
        present = [g for g in KERNEL_OP_GROUPS if getattr(self, g) is not None]
        return f"<{type(self).__name__} of {self.backend.name}: {', '.join(present) or 'none'}>"
