"""KernelOps written as compositions of TensorOps calls: the fallback on every backend.

Each function has the contract of the KernelOps method of the same name (see
:mod:`accelkit.ops.kernel_ops`), takes the backend as its first argument and validates with the
same shared checks, so a bad call fails with the same message on either route. Where TensorOps
already has the op (rms_norm, layer_norm, attention, gelu, linear, argmax) the composition is
that op, so that each backend has one reference implementation of it. F16 and BF16 are cast to
F32 for the arithmetic and back once, as the fused kernels do.

Like every TensorOps call, these are submissions: they return at once and the work runs in
stream order, so they mix freely with fused kernels on the same stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from accelkit._core.kernel_validation import (
    GUMBEL_UNIFORM_MAX,
    GeluApproximation,
    check_gelu,
    check_logits,
    check_norm,
    check_paged_attention,
    check_quantized_linear,
    check_rms_norm_residual,
    check_rotary,
    check_sampling,
    check_silu_mul,
    rotary_inv_freq,
)
from accelkit.dtype import DType
from accelkit.quant import BLOCK_SIZE, QuantFormat
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.abc.backend import ComputeBackend
    from accelkit.ops.tensor_ops import TensorOps

__all__ = [
    "argmax", "attention", "gelu", "layer_norm", "linear", "paged_attention", "quantized_linear",
    "rms_norm", "rms_norm_residual", "rotary_embedding", "sample_token", "silu_mul",
]  # fmt: skip

#: Below the best logit by more than this, a token's probability is under 1e-38 (and Gumbel
#: noise spans about 20), so the top-k/top-p threshold search treats such tokens alike.
_NEGLIGIBLE_LOGIT_GAP = 88.0


def _compute_dtype(dtype: DType) -> DType:
    return DType.F64 if dtype is DType.F64 else DType.F32


def _as(ops: TensorOps, x: Tensor, dtype: DType) -> Tensor:
    return x if x.dtype is dtype else ops.cast(x, dtype)


# -- norms ----------------------------------------------------------------------------------------
def rms_norm(
    backend: ComputeBackend, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6
) -> Tensor:
    eps_ = check_norm(backend, "rms_norm", x, eps, weight=weight)
    return backend.tensor_ops.rms_norm(x, weight, eps_)


def rms_norm_residual(
    backend: ComputeBackend,
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    eps_ = check_rms_norm_residual(backend, x, residual, weight, eps)
    ops = backend.tensor_ops
    summed = ops.add(x, residual)
    return ops.rms_norm(summed, weight, eps_), summed


def layer_norm(
    backend: ComputeBackend,
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    eps_ = check_norm(backend, "layer_norm", x, eps, weight=weight, bias=bias)
    return backend.tensor_ops.layer_norm(x, weight, bias, eps_)


# -- positions ------------------------------------------------------------------------------------
def rotary_embedding(
    backend: ComputeBackend,
    x: Tensor,
    positions: Tensor | None = None,
    base: float = 10000.0,
    offset: int = 0,
) -> Tensor:
    base_, offset_ = check_rotary(backend, x, positions, base, offset)
    ops, f = backend.tensor_ops, backend.tensor_factory
    b, _, s, d = x.shape
    half = d // 2
    ct = _compute_dtype(x.dtype)
    pos = f.arange(offset_, offset_ + s, dtype=ct) if positions is None else ops.cast(positions, ct)
    inv_freq = f.from_host(rotary_inv_freq(d, base_), dtype=ct)
    angles = ops.mul(ops.reshape(pos, (*pos.shape, 1)), inv_freq)  # [(B,) S, D/2]
    if angles.ndim == 3:
        angles = ops.reshape(angles, (b, 1, s, half))
    cos, sin = ops.cos(angles), ops.sin(angles)
    xf = _as(ops, x, ct)
    x1, x2 = ops.narrow(xf, 3, 0, half), ops.narrow(xf, 3, half, half)
    out1 = ops.sub(ops.mul(x1, cos), ops.mul(x2, sin))
    out2 = ops.add(ops.mul(x2, cos), ops.mul(x1, sin))
    return _as(ops, ops.concat([out1, out2], 3), x.dtype)


# -- attention ------------------------------------------------------------------------------------
def attention(
    backend: ComputeBackend,
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
    return backend.tensor_ops.attention(
        q, k, v, scale=scale, causal=causal, mask=mask, causal_alignment=causal_alignment,
        window=window, key_lengths=key_lengths, softcap=softcap, layout=layout,
    )  # fmt: skip


def paged_attention(
    backend: ComputeBackend,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """Gather each sequence's blocks into a dense [batch, kv_heads, max_len, head_dim] context
    (``embedding`` over the cache viewed as one row per block), then masked attention."""
    sc = check_paged_attention(backend, q, k_cache, v_cache, block_table, context_lens, scale)
    ops, f = backend.tensor_ops, backend.tensor_factory
    b, h, d = q.shape
    num_blocks, block_size, hk, _ = k_cache.shape
    max_blocks = block_table.shape[1]
    max_len = max_blocks * block_size
    # Lengths out of 0..max_len are reported when the result is awaited, as the fused kernels
    # report them (a length past the table was cut to it, a negative one gave zeros).
    context_lens = ops._checked(ops.reshape(context_lens, (b,)), max_len + 1)
    if max_len == 0:  # no sequence has a token: every output is zeros (the contract's; queued
        return f.zeros(q.shape, q.dtype)  # after the check, whose error its await raises)
    # Entries past a sequence's length may hold anything (padding, -1): read block 0 there, and
    # mask those positions out below.
    used = ops.lt(ops.mul(f.arange(max_blocks), block_size), ops.reshape(context_lens, (b, 1)))
    blocks = ops.where(used, block_table, 0)

    def gather(cache: Tensor) -> Tensor:
        rows = ops.embedding(blocks, ops.reshape(cache, (num_blocks, block_size * hk * d)))
        return ops.permute(ops.reshape(rows, (b, max_len, hk, d)), (0, 2, 1, 3))

    visible = ops.lt(f.arange(max_len), ops.reshape(context_lens, (b, 1, 1, 1)))  # [B,1,1,L]
    out = ops.attention(
        ops.reshape(q, (b, h, 1, d)), gather(k_cache), gather(v_cache), scale=sc, mask=visible
    )
    return ops.reshape(out, (b, h, d))


# -- activations ----------------------------------------------------------------------------------
def silu_mul(backend: ComputeBackend, gate: Tensor, up: Tensor) -> Tensor:
    check_silu_mul(backend, gate, up)
    ops = backend.tensor_ops
    ct = _compute_dtype(gate.dtype)
    return _as(ops, ops.mul(ops.silu(_as(ops, gate, ct)), _as(ops, up, ct)), gate.dtype)


def gelu(backend: ComputeBackend, x: Tensor, approximate: GeluApproximation = "none") -> Tensor:
    return backend.tensor_ops.gelu(x, check_gelu(backend, x, approximate))


# -- linear ---------------------------------------------------------------------------------------
def linear(
    backend: ComputeBackend, x: Tensor, weight: Tensor, bias: Tensor | None = None
) -> Tensor:
    return backend.tensor_ops.linear(x, weight, bias)


def quantized_linear(
    backend: ComputeBackend,
    x: Tensor,
    qweight: Tensor,
    scales: Tensor,
    bias: Tensor | None = None,
    format: QuantFormat = "q8_0",
) -> Tensor:
    fmt = check_quantized_linear(backend, x, qweight, scales, bias, format)
    ops = backend.tensor_ops
    ct = _compute_dtype(x.dtype)
    weight = dequantize(backend, qweight, scales, fmt, ct)
    b = None if bias is None else _as(ops, bias, ct)
    return _as(ops, ops.linear(_as(ops, x, ct), weight, b), x.dtype)


def dequantize(
    backend: ComputeBackend, qweight: Tensor, scales: Tensor, format: QuantFormat, dtype: DType
) -> Tensor:
    """The [out, in] weight of ``dtype`` (validated inputs): ``scale * q`` per block of 32, with
    q4_0's nibbles split by division (``high = floor(byte / 16)``, ``low = byte mod 16``)."""
    ops = backend.tensor_ops
    n_out, n_blocks = scales.shape
    q = ops.cast(qweight, dtype)
    if format == "q4_0":
        packed = ops.reshape(q, (n_out, n_blocks, BLOCK_SIZE // 2))
        low, high = ops.mod(packed, 16.0), ops.floor(ops.div(packed, 16.0))
        values = ops.sub(ops.concat([low, high], 2), 8.0)
    else:
        values = ops.reshape(q, (n_out, n_blocks, BLOCK_SIZE))
    weight = ops.mul(values, ops.reshape(ops.cast(scales, dtype), (n_out, n_blocks, 1)))
    return ops.reshape(weight, (n_out, n_blocks * BLOCK_SIZE))


# -- sampling -------------------------------------------------------------------------------------
def argmax(backend: ComputeBackend, logits: Tensor) -> Tensor:
    check_logits(backend, "argmax", logits)
    return backend.tensor_ops.argmax(logits, axis=-1)


def sample_token(
    backend: ComputeBackend,
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    previous_tokens: Tensor | None = None,
    seed: int | None = None,
) -> Tensor:
    """Top-k and top-p find their threshold by bisection over the logit range (TensorOps has no
    sort): a fixed number of masked counts or sums per row, exact to float resolution."""
    params = check_sampling(
        backend, logits, previous_tokens, temperature, top_k, top_p, repetition_penalty, seed
    )
    ops, f = backend.tensor_ops, backend.tensor_factory
    vocab = logits.shape[-1]
    ct = _compute_dtype(logits.dtype)
    z = ops.reshape(_as(ops, logits, ct), (-1, vocab))
    if previous_tokens is not None and params.repetition_penalty != 1.0:
        previous = ops.reshape(previous_tokens, (z.shape[0], -1))
        z = _repetition_penalty(backend, z, previous, params.repetition_penalty)
    if params.temperature == 0.0:
        return ops.reshape(ops.argmax(z, axis=-1), logits.shape[:-1])
    z = ops.div(z, params.temperature)
    # A NaN or +inf (outside the precondition) is never masked: the argmax at the end picks the
    # first NaN, else the first +inf, as the special-values rule says.
    if 0 < params.top_k < vocab:
        k = params.top_k
        keep = _keep_top(ops, z, lambda sel: ops.ge(ops.sum(sel, axis=-1, keepdims=True), k))
        z = ops.where(keep, z, _masked(ops, z))
    if params.top_p < 1.0:
        p, top_p = ops.softmax(z, axis=-1), params.top_p

        def reaches_top_p(sel: Tensor) -> Tensor:
            return ops.ge(ops.sum(ops.where(sel, p, 0.0), axis=-1, keepdims=True), top_p)

        keep = _keep_top(ops, z, reaches_top_p)
        z = ops.where(keep, z, _masked(ops, z))
    u = ops.minimum(f.uniform(z.shape, 0.0, 1.0, seed=params.seed), GUMBEL_UNIFORM_MAX)
    gumbel = ops.neg(ops.log(ops.neg(ops.log(_as(ops, u, ct)))))
    return ops.reshape(ops.argmax(ops.add(z, gumbel), axis=-1), logits.shape[:-1])


def _masked(ops: TensorOps, z: Tensor) -> Tensor:
    """-inf, but NaN and +inf where ``z`` has them (what a top-k or top-p mask drops to)."""
    return ops.where(ops.lt(z, float("inf")), float("-inf"), z)


def _repetition_penalty(
    backend: ComputeBackend, z: Tensor, previous: Tensor, penalty: float
) -> Tensor:
    """CTRL's penalty on ``z`` [B, V] for the ids in ``previous`` [B, n] (negative: padding)."""
    ops, f = backend.tensor_ops, backend.tensor_factory
    rows, vocab = z.shape
    # Padding ids are sent to a spare column past the vocabulary, which is then dropped. The
    # real ids are checked first (an id equal to vocab landed in the spare column and was
    # skipped; the fused kernels refuse it).
    padding = ops.lt(previous, 0)
    ids = ops.where(padding, vocab, ops._checked(ops.where(padding, 0, previous), vocab))
    seen = ops.scatter(f.zeros((rows, vocab + 1), DType.BOOL), 1, ids, True)
    seen = ops.narrow(seen, 1, 0, vocab)
    penalized = ops.where(ops.gt(z, 0.0), ops.div(z, penalty), ops.mul(z, penalty))
    return ops.where(seen, penalized, z)


def _keep_top(ops: TensorOps, z: Tensor, enough: Callable[[Tensor], Tensor]) -> Tensor:
    """Mask ``z >= t`` for the largest threshold ``t`` per row where ``enough(z >= t)`` holds.

    ``enough`` maps a [B, V] selection to a [B, 1] verdict and must be monotone (true for low
    thresholds, false for high ones). Bisection keeps ``lo`` enough and ``hi`` not. The bracket
    starts at most ``2 |max| + 89`` wide and halves each step, so it ends far below the float
    spacing of logits of ordinary size: no distinct logit lies between ``lo`` and ``hi`` and the
    kept set is the exact one (logits closer than ``width / 2**steps`` could be misjudged).
    """
    steps = 64 if z.dtype is DType.F64 else 40
    zmax = ops.max(z, axis=-1, keepdims=True)
    zc = ops.maximum(z, ops.sub(zmax, _NEGLIGIBLE_LOGIT_GAP))  # also keeps -inf out
    lo = ops.min(zc, axis=-1, keepdims=True)  # selects every token: enough
    hi = ops.add(zmax, ops.add(ops.abs(zmax), 1.0))  # selects none: not enough
    for _ in range(steps):
        mid = ops.mul(ops.add(lo, hi), 0.5)
        ok = enough(ops.ge(zc, mid))
        lo, hi = ops.where(ok, mid, lo), ops.where(ok, hi, mid)
    return ops.ge(zc, lo)
