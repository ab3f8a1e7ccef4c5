"""NumPy bodies of the KernelOps that TensorOps has no kernel for (inputs already validated).

Each function is one launch of its whole op, with as few temporaries as NumPy allows; the ops
that TensorOps already has (rms_norm, layer_norm, attention, linear, gelu) reuse its bodies in
:mod:`accelkit._core.host_kernels.nn`, and ``rms_norm_residual`` and ``paged_attention`` pass
their ``accel`` on to them. F16 and BF16 are computed in F32 and rounded once when
stored. Errors that depend on values (ids out of range) are raised here, and so surface when the
result is awaited.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numexpr
import numpy as np

from accelkit._core.host_arrays import up
from accelkit._core.host_kernels import NUMPY_ONLY, HostAccelerator
from accelkit._core.host_kernels.nn import rms_norm, softmax_rows
from accelkit._core.kernel_validation import GUMBEL_UNIFORM_MAX, SamplingParams, rotary_inv_freq
from accelkit.errors import InvalidArgumentError
from accelkit.quant import QuantFormat, dequantize

__all__ = [
    "argmax", "paged_attention", "quantized_linear", "rms_norm_residual", "rotary_embedding",
    "sample_token", "silu_mul",
]  # fmt: skip

Array = np.ndarray[Any, Any]
_LOW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_NUMEXPR_MIN = 1 << 15
#: Weight elements expanded at once by quantized_linear (16 MiB of f32).
_DEQUANT_CHUNK_ELEMS = 1 << 22


def _compute_dtype(x: Array) -> np.dtype[Any]:
    return np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)


def _store(out: Array, value: Array) -> None:
    if value.dtype == out.dtype:
        np.copyto(out, value)
    else:
        out[...] = value


def rms_norm_residual(
    x: Array,
    residual: Array,
    w: Array | None,
    eps: float,
    normed: Array,
    summed: Array,
    *,
    accel: HostAccelerator = NUMPY_ONLY,
) -> None:
    """``summed = x + residual`` (rounded to its dtype), then ``normed = rms_norm(summed)``
    (through ``accel`` where it takes it)."""
    if x.dtype in _LOW:
        summed[...] = up(x) + up(residual)
    else:
        np.add(x, residual, out=summed)
    rms_norm(summed, w, eps, normed, accel=accel)


def rotary_embedding(
    x: Array, positions: Array | None, base: float, offset: int, out: Array
) -> None:
    ct = _compute_dtype(x)
    _, _, s, d = x.shape
    half = d // 2
    pos = np.arange(offset, offset + s) if positions is None else positions
    angles = pos.astype(ct)[..., None] * rotary_inv_freq(d, base).astype(ct)  # [(B,) S, D/2]
    if angles.ndim == 3:
        angles = angles[:, None]  # [B, 1, S, D/2]: one position per (batch, token)
    cos, sin = np.cos(angles), np.sin(angles)
    xf = x.astype(ct, copy=False)
    x1, x2 = xf[..., :half], xf[..., half:]
    res = np.empty(x.shape, ct)
    np.subtract(x1 * cos, x2 * sin, out=res[..., :half])
    np.add(x2 * cos, x1 * sin, out=res[..., half:])
    _store(out, res)


def paged_attention(
    q: Array,
    k_cache: Array,
    v_cache: Array,
    block_table: Array,
    context_lens: Array,
    scale: float,
    out: Array,
    *,
    accel: HostAccelerator = NUMPY_ONLY,
) -> None:
    """Per sequence: gather its blocks, attend its one query per head over them (the scores'
    softmax through ``accel`` where it takes it)."""
    ct = _compute_dtype(q)
    b, h, d = q.shape
    num_blocks, block_size, hk = k_cache.shape[:3]
    max_len = block_table.shape[1] * block_size
    lens = context_lens.astype(np.int64)
    if lens.size and (int(lens.min()) < 0 or int(lens.max()) > max_len):
        raise InvalidArgumentError(
            f"paged_attention: context_lens must lie in 0..{max_len} (max_blocks * block_size);"
            f" got values from {int(lens.min())} to {int(lens.max())}"
        )
    res = np.zeros((b, hk, h // hk, d), ct)
    qg = q.astype(ct, copy=False).reshape(b, hk, h // hk, d)
    with np.errstate(all="ignore"):
        for i in range(b):
            n = int(lens[i])
            if n == 0:
                continue
            blocks = block_table[i, : -(-n // block_size)].astype(np.intp)
            if int(blocks.min()) < 0 or int(blocks.max()) >= num_blocks:
                raise InvalidArgumentError(
                    f"paged_attention: block_table[{i}] refers to blocks {int(blocks.min())} to"
                    f" {int(blocks.max())}; the cache has blocks 0..{num_blocks - 1}"
                )
            k = k_cache[blocks].reshape(-1, hk, d)[:n].astype(ct, copy=False)  # [n, Hkv, D]
            v = v_cache[blocks].reshape(-1, hk, d)[:n].astype(ct, copy=False)
            scores = np.einsum("kgd,nkd->kgn", qg[i], k) * ct.type(scale)  # [Hkv, G, n]
            p = softmax_rows(scores, accel=accel)
            res[i] = np.einsum("kgn,nkd->kgd", p, v)
    _store(out, res.reshape(b, h, d))


def silu_mul(gate: Array, up_: Array, out: Array) -> None:
    g, u = up(gate), up(up_)
    if g.size >= _NUMEXPR_MIN:
        target = out if out.dtype == g.dtype else np.empty(out.shape, g.dtype)
        numexpr.evaluate("g / (1 + exp(-g)) * u", local_dict={"g": g, "u": u}, out=target)
        if target is not out:
            out[...] = target
    else:
        with np.errstate(over="ignore"):
            _store(out, g / (1 + np.exp(-g)) * u)


def quantized_linear(
    x: Array, qweight: Array, scales: Array, bias: Array | None, fmt: QuantFormat, out: Array
) -> None:
    """Expand the weight a slab of output rows at a time, so memory stays bounded."""
    ct = _compute_dtype(x)
    n_out = qweight.shape[0]
    n_in = x.shape[-1]
    xf = x.reshape(math.prod(x.shape[:-1]), n_in).astype(ct, copy=False)  # (n_in may be 0)
    res = np.empty((xf.shape[0], n_out), ct)
    rows = max(1, _DEQUANT_CHUNK_ELEMS // n_in)
    for r0 in range(0, n_out, rows):
        r1 = min(n_out, r0 + rows)
        w = dequantize(qweight[r0:r1], scales[r0:r1], fmt, dtype=ct)
        np.matmul(xf, w.T, out=res[:, r0:r1])
    if bias is not None:
        res += bias.astype(ct, copy=False)
    _store(out, res.reshape(out.shape))


def argmax(logits: Array, out: Array) -> None:
    out[...] = np.argmax(up(logits), axis=-1)


def _apply_repetition_penalty(z: Array, previous: Array, penalty: float) -> Array:
    """CTRL's penalty on ``z`` [B, V] for the tokens in ``previous`` [B, n] (< 0: padding)."""
    vocab = z.shape[1]
    if previous.size and int(previous.max()) >= vocab:
        raise InvalidArgumentError(
            f"sample_token: previous_tokens must lie in 0..{vocab - 1} (negative entries are"
            f" padding); got {int(previous.max())}"
        )
    seen = np.zeros(z.shape, np.bool_)
    rows = np.broadcast_to(np.arange(z.shape[0])[:, None], previous.shape)
    valid = previous >= 0
    seen[rows[valid], previous[valid]] = True
    penalized = np.where(z > 0, z / z.dtype.type(penalty), z * z.dtype.type(penalty))
    return np.where(seen, penalized, z)


def _nucleus(z: Array, top_p: float) -> Array:
    """Mask of the smallest set of most likely tokens per row whose mass reaches ``top_p``:
    a token stays when the mass of the tokens strictly more likely than it is below ``top_p``
    (so tokens tied at the boundary all stay)."""
    p = softmax_rows(z.copy())
    order = np.argsort(-p, axis=-1, kind="stable")
    ps = np.take_along_axis(p, order, axis=-1)
    before = np.cumsum(ps, axis=-1) - ps
    # For a run of equal probabilities, the mass strictly above is the value at the run's start.
    n = ps.shape[-1]
    starts = np.ones(ps.shape, np.bool_)
    starts[:, 1:] = ps[:, 1:] != ps[:, :-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0), axis=-1)
    keep_sorted = np.take_along_axis(before, first, axis=-1) < top_p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep


def sample_token(logits: Array, previous: Array | None, params: SamplingParams, out: Array) -> None:
    ct = _compute_dtype(logits)
    vocab = logits.shape[-1]
    z = logits.reshape(-1, vocab).astype(ct)  # a copy: the steps below work in place
    if previous is not None and params.repetition_penalty != 1.0:
        z = _apply_repetition_penalty(
            z, previous.reshape(z.shape[0], -1), params.repetition_penalty
        )
    if params.temperature == 0.0:
        out[...] = np.argmax(z, axis=-1).reshape(out.shape)
        return
    z /= ct.type(params.temperature)
    with np.errstate(all="ignore"):
        # A NaN or +inf (outside the precondition) is never masked: the argmax below picks
        # the first NaN, else the first +inf, as the special-values rule says.
        special = ~(z < np.inf)
        if 0 < params.top_k < vocab:
            kth = np.partition(z, vocab - params.top_k, axis=-1)[:, vocab - params.top_k, None]
            z = np.where((z >= kth) | special, z, -np.inf).astype(ct, copy=False)
        if params.top_p < 1.0:
            z = np.where(_nucleus(z, params.top_p) | special, z, -np.inf).astype(ct, copy=False)
        # The same noise as tensor_factory.uniform(shape, seed=seed): NumPy's PCG64, in f32.
        u = np.random.default_rng(params.seed).uniform(0.0, 1.0, size=z.shape).astype(np.float32)
        u = np.minimum(u, np.float32(GUMBEL_UNIFORM_MAX)).astype(ct, copy=False)
        gumbel = -np.log(-np.log(u))
        out[...] = np.argmax(z + gumbel, axis=-1).reshape(out.shape)
