"""NumPy bodies of matrix products and neural-network ops (inputs already validated).

Low-precision floats (F16, BF16) are computed in F32 and rounded once when stored. ``softmax``,
``attention``, ``layer_norm`` and ``rms_norm`` ask their ``accel``
(:class:`~accelkit._core.host_kernels.HostAccelerator`) first for their hot step.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from accelkit._core.host_arrays import up
from accelkit._core.host_kernels import NUMPY_ONLY, HostAccelerator
from accelkit.errors import InvalidArgumentError

__all__ = [
    "adam_update", "attention", "conv2d", "cross_entropy", "embedding", "gather", "gemm",
    "layer_norm", "linear", "matmul", "rms_norm", "scatter", "softmax",
]  # fmt: skip

Array = np.ndarray[Any, Any]
_LOW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_ATTN_CHUNK_ELEMS = 1 << 22  # score elements per chunk (16 MiB of f32)


def _compute_dtype(*xs: Array) -> np.dtype[Any]:
    dt = np.result_type(*(up(x) for x in xs))
    return np.dtype(np.float32) if dt in _LOW else dt


def _store(out: Array, value: Any) -> None:
    if isinstance(value, np.ndarray) and value.dtype == out.dtype:
        np.copyto(out, value)
    else:
        out[...] = value


def gemm(
    a: Array,
    b: Array,
    c: Array | None,
    out: Array,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
) -> None:
    if out.dtype.kind in "iu":
        # An integer result: computed in its dtype (products and sums wrap there), with whole
        # alpha and beta (checked by the core). A narrower a and b are widened first (I8 x I8
        # into I32 overflowed in I8).
        ct = out.dtype
    else:
        ct = _compute_dtype(a, b) if out.dtype not in _LOW else np.dtype(np.float32)
    av, bv = a.astype(ct, copy=False), b.astype(ct, copy=False)
    if trans_a:
        av = np.swapaxes(av, -1, -2)
    if trans_b:
        bv = np.swapaxes(bv, -1, -2)
    if out.dtype == ct:
        np.matmul(av, bv, out=out)
        res = out
    else:
        res = np.matmul(av, bv)
    if out.dtype.kind in "iu":
        # In the integer type: it wraps, as the products do (in float64, I64 beyond 2**53 lost
        # its low bits and overflow gave INT_MIN). A float result (integer a and b with a float
        # c) takes the float path below.
        if alpha != 1.0:
            res = np.multiply(res, ct.type(int(alpha)))
        if c is not None:
            res = res + up(c).astype(ct, copy=False) * ct.type(int(beta))
    else:
        if alpha != 1.0:
            res = res * alpha if res is not out else np.multiply(res, alpha, out=out)
        if c is not None:
            res = res + beta * up(c)
    if res is not out:
        _store(out, res)


def matmul(a: Array, b: Array, out: Array) -> None:
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous and out.flags.c_contiguous:
        # [..., m, k] @ [k, n] is one [M, k] @ [k, n] GEMM: a single BLAS call beats NumPy's
        # loop over the batch (about 15 % on a transformer's projections).
        # (the row count spelled out: reshape cannot infer -1 where k or n is 0)
        rows = math.prod(a.shape[:-1])
        a = a.reshape(rows, a.shape[-1])
        out = out.reshape(rows, out.shape[-1])
    dt = out.dtype
    if (a.dtype is dt and b.dtype is dt and (dt is _F32 or dt is _F64)) or (
        a.dtype == b.dtype == dt and dt not in _LOW
    ):
        np.matmul(a, b, out=out)
    else:
        ct = _compute_dtype(a, b)
        _store(out, np.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False)))


def linear(x: Array, w: Array, bias: Array | None, out: Array) -> None:
    matmul(x, w.T, out)
    if bias is not None:
        if out.dtype in _LOW:
            _store(out, out.astype(np.float32) + up(bias))
        else:
            np.add(out, bias, out=out, casting="unsafe")


def conv2d(
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> None:
    """im2col + one batched matmul per group."""
    xf, wf = up(x), up(w)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if ph or pw:
        xf = np.pad(xf, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    win = sliding_window_view(xf, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    oh, ow = out.shape[2], out.shape[3]
    win = win[:, :, :oh, :ow]
    g = groups
    # [N, G, Cg, OH, OW, KH, KW] -> [N, G, OH*OW, Cg*KH*KW]
    cols = win.reshape(n, g, cg, oh, ow, kh, kw).transpose(0, 1, 3, 4, 2, 5, 6)
    cols = cols.reshape(n, g, oh * ow, cg * kh * kw)
    wm = wf.reshape(g, o // g, cg * kh * kw).transpose(0, 2, 1)  # [G, Cg*KH*KW, O/G]
    res = np.matmul(cols, wm)  # [N, G, OH*OW, O/G]
    res = res.transpose(0, 1, 3, 2).reshape(n, o, oh, ow)
    if bias is not None:
        res = res + up(bias)[None, :, None, None]
    _store(out, res)


def softmax_rows(
    s: Array,
    log: bool = False,
    empty_rows: str = "zero",
    *,
    accel: HostAccelerator = NUMPY_ONLY,
) -> Array:
    """Stable (log-)softmax over the last axis, in place on ``s`` (float32/64): ``accel``'s
    kernel where it has one (softmax, not log), else :func:`_softmax_rows_numpy`."""
    if not log and accel.softmax_rows(s, s, empty_nan=empty_rows == "nan"):
        return s
    return _softmax_rows_numpy(s, log, empty_rows)


def _softmax_rows_numpy(s: Array, log: bool = False, empty_rows: str = "zero") -> Array:
    """Stable (log-)softmax over the last axis, in place on ``s`` (float32/64).

    Special values (docs/operations.md): a row holding a NaN or +inf is NaN throughout. A row
    that is all -inf (it sees nothing) is NaN with ``empty_rows="nan"`` (``softmax``, as IEEE
    arithmetic gives) and zeros with ``"zero"`` (attention over fully masked rows).
    """
    if s.shape[-1] == 0:
        return s
    with np.errstate(all="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        finite = np.isfinite(m)
        nan_rows = None
        if not finite.all():
            nan_rows = ~finite if empty_rows == "nan" else ~(finite | (m == -np.inf))
            m = np.where(finite, m, 0)
        s -= m
        if log:
            lse = np.log(np.sum(np.exp(s), axis=-1, keepdims=True))
            s -= lse
        else:
            np.exp(s, out=s)  # NumPy's SIMD exp beats numexpr's here
            total = np.sum(s, axis=-1, keepdims=True)
            if total.size and total.min() > 0:
                s *= 1 / total  # one division per row, then multiplies
            else:
                np.divide(s, total, out=s, where=total > 0)  # rows that see nothing stay 0
        if nan_rows is not None and nan_rows.any():
            s[np.broadcast_to(nan_rows, s.shape)] = np.nan
    return s


def softmax(
    x: Array, axis: int, out: Array, log: bool, *, accel: HostAccelerator = NUMPY_ONLY
) -> None:
    """(Log-)softmax along ``axis``; a softmax along the last axis through ``accel`` where it
    takes it."""
    if not log and axis in (-1, x.ndim - 1) and accel.softmax_rows(x, out, empty_nan=True):
        return
    ct = _compute_dtype(x) if x.dtype.kind == "f" else np.dtype(np.float32)
    s = np.moveaxis(x, axis, -1).astype(ct, copy=True)
    with np.errstate(all="ignore"):
        s = softmax_rows(s, log, empty_rows="nan", accel=accel)
    _store(out, np.moveaxis(s, -1, axis))


def attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    out: Array,
    scale: float,
    causal: bool,
    *,
    accel: HostAccelerator = NUMPY_ONLY,
) -> None:
    """Grouped-KV attention: ``accel``'s kernel where it has one, else
    :func:`_attention_chunked` (whose scores' softmax ``accel`` may still take)."""
    if not accel.attention(q, k, v, mask, out, scale, causal):
        _attention_chunked(q, k, v, mask, out, scale, causal, accel=accel)


def _attention_chunked(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    out: Array,
    scale: float,
    causal: bool,
    *,
    accel: HostAccelerator = NUMPY_ONLY,
) -> None:
    """Grouped-KV attention, chunked over query rows so scores stay bounded in memory; the
    scores' softmax through ``accel`` where it takes it."""
    ct = _compute_dtype(q)
    b, h, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    grp = h // hk
    qg = q.astype(ct, copy=False).reshape(b, hk, grp, sq, d)
    kt = np.swapaxes(k.astype(ct, copy=False), -1, -2)[:, :, None]  # [B, Hkv, 1, D, Skv]
    vg = v.astype(ct, copy=False)[:, :, None]  # [B, Hkv, 1, Skv, Dv]
    if mask is not None:
        mk = np.broadcast_to(mask, (b, h, sq, sk)).reshape(b, hk, grp, sq, sk)
    rows = max(1, _ATTN_CHUNK_ELEMS // max(1, b * h * sk))
    if causal:
        # Smaller chunks let each one stop at the last key its rows can see: about half the
        # score work for a square causal mask.
        rows = min(rows, max(16, sq // 8))
    direct = out.dtype == ct
    res = out.reshape(b, hk, grp, sq, dv) if direct else np.empty((b, hk, grp, sq, dv), ct)
    offset = sk - sq
    qg = qg * ct.type(scale)  # scaling q costs D per row, scaling the scores Skv
    if causal:  # 0 where key j is visible to query i, -inf elsewhere; sliced per chunk
        # Hidden scores are set to -inf (not biased by -inf: a NaN score from a key the row
        # cannot see must not reach it).
        hidden = np.arange(sk)[None, :] > np.arange(sq)[:, None] + offset
    with np.errstate(all="ignore"):
        for r0 in range(0, sq, rows):
            r1 = min(sq, r0 + rows)
            kend = min(sk, r1 + offset) if causal else sk
            if kend <= 0:  # no row of this chunk sees any key
                res[:, :, :, r0:r1] = 0
                continue
            s = np.matmul(qg[:, :, :, r0:r1], kt[..., :kend])
            if mask is not None:
                mc = mk[:, :, :, r0:r1, :kend]
                if mc.dtype == np.bool_:
                    s = np.where(mc, s, -np.inf)
                else:
                    s += up(mc)
            # Rows that see no key come out as zeros (softmax_rows leaves them at exp(-inf)).
            # The accelerator takes the causal mask as each row's last visible key; NumPy's
            # softmax takes it as -inf scores.
            if not accel.softmax_rows(
                s, s, empty_nan=False, period=(r1 - r0) if causal else 0, base=r0 + offset
            ):
                if causal:
                    np.copyto(s, -np.inf, where=hidden[r0:r1, :kend])
                _softmax_rows_numpy(s)
            np.matmul(s, vg[..., :kend, :], out=res[:, :, :, r0:r1])
    if not direct:
        _store(out, res.reshape(b, h, sq, dv))


def layer_norm(
    x: Array,
    w: Array | None,
    bias: Array | None,
    eps: float,
    out: Array,
    *,
    accel: HostAccelerator = NUMPY_ONLY,
) -> None:
    """Layer norm over the last axis: ``accel``'s kernel where it has one, else NumPy's."""
    if not out.size:  # nothing to write (a mean of no values would warn)
        return
    if not accel.layer_norm(x, w, bias, eps, out):
        _layer_norm_numpy(x, w, bias, eps, out)


def _layer_norm_numpy(
    x: Array, w: Array | None, bias: Array | None, eps: float, out: Array
) -> None:
    # Two-pass (mean, then the centred sum of squares: stable), written in place into the
    # output where its dtype allows: about half the passes and none of the temporaries of the
    # textbook expression.
    ct = _compute_dtype(x)
    xf = x.astype(ct, copy=False)
    d = x.shape[-1]
    res = out if out.dtype == ct else np.empty(out.shape, ct)
    np.subtract(xf, np.mean(xf, axis=-1, keepdims=True), out=res)
    r2 = res.reshape(math.prod(x.shape[:-1]), d)  # (not -1: d may be 0)
    # The sum of squares in float64, as the JIT kernels sum it (in float32 a finite row of
    # 1e20s overflowed to inf and came out 0, until the JIT had compiled and made it right).
    var = np.einsum("ij,ij->i", r2, r2, dtype=np.float64) / d
    rstd = (1.0 / np.sqrt(var + eps)).astype(ct).reshape(*x.shape[:-1], 1)
    res *= rstd
    if w is not None:
        res *= up(w)
    if bias is not None:
        res += up(bias)
    if res is not out:
        _store(out, res)


def rms_norm(
    x: Array, w: Array | None, eps: float, out: Array, *, accel: HostAccelerator = NUMPY_ONLY
) -> None:
    """RMS norm over the last axis: ``accel``'s kernel where it has one, else NumPy's."""
    if not out.size:  # nothing to write
        return
    if not accel.rms_norm(x, w, eps, out):
        _rms_norm_numpy(x, w, eps, out)


def _rms_norm_numpy(x: Array, w: Array | None, eps: float, out: Array) -> None:
    ct = _compute_dtype(x)
    xf = x.astype(ct, copy=False)
    d = x.shape[-1]
    x2 = xf.reshape(math.prod(x.shape[:-1]), d)  # (not -1: d may be 0)
    ms = np.einsum("ij,ij->i", x2, x2, dtype=np.float64) / d  # float64, as the JIT (above)
    rstd = (1.0 / np.sqrt(ms + eps)).astype(ct).reshape(*x.shape[:-1], 1)
    res = out if out.dtype == ct else np.empty(out.shape, ct)
    np.multiply(xf, rstd, out=res)
    if w is not None:
        res *= up(w)
    if res is not out:
        _store(out, res)


def _check_range(idx: Array, n: int, op: str, what: str) -> None:
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise InvalidArgumentError(
            f"{op}: {what} must lie in 0..{n - 1}; got values from {int(idx.min())} to"
            f" {int(idx.max())}"
        )


def cross_entropy(logits: Array, targets: Array, reduction: str, loss: Array, probs: Array) -> None:
    _check_range(targets, logits.shape[1], "cross_entropy", "targets")
    ct = _compute_dtype(logits)
    with np.errstate(all="ignore"):
        logp = softmax_rows(logits.astype(ct, copy=True), log=True, empty_rows="nan")
    picked = -np.take_along_axis(logp, targets.astype(np.int64)[:, None], axis=1)[:, 0]
    if reduction == "mean":
        _store(loss, picked.mean() if picked.size else np.nan)
    elif reduction == "sum":
        _store(loss, picked.sum())
    else:
        _store(loss, picked)
    _store(probs, np.exp(logp))


def embedding(indices: Array, weight: Array, out: Array) -> None:
    _check_range(indices, weight.shape[0], "embedding", "indices")
    np.take(weight, indices.astype(np.intp, copy=False), axis=0, out=out)


def _checked_index(index: Array, dim: int, op: str) -> Array:
    """Index values in -dim..dim-1, made non-negative; InvalidArgumentError otherwise."""
    if index.size and (int(index.min()) < -dim or int(index.max()) >= dim):
        raise InvalidArgumentError(
            f"{op}: index values must lie in {-dim}..{dim - 1}; got {int(index.min())} to"
            f" {int(index.max())}"
        )
    return np.where(index < 0, index + dim, index).astype(np.intp)


def _corner(index: Array, axis: int) -> tuple[slice, ...]:
    """The part of a tensor ``index`` covers off ``axis`` (index may be smaller there)."""
    return tuple(slice(None) if i == axis else slice(0, d) for i, d in enumerate(index.shape))


def gather(x: Array, axis: int, index: Array, out: Array) -> None:
    idx = _checked_index(index, x.shape[axis], "gather")
    np.copyto(out, np.take_along_axis(x[_corner(index, axis)], idx, axis=axis))


def scatter(x: Array, axis: int, index: Array, src: Array | int | float, out: Array) -> None:
    """``out = x`` with ``src`` (an array, or a scalar) written at ``index`` along ``axis``."""
    idx = _checked_index(index, x.shape[axis], "scatter")
    np.copyto(out, x)
    if isinstance(src, np.ndarray):
        values = src[tuple(slice(0, d) for d in index.shape)]
    else:
        values = np.asarray(src, dtype=out.dtype)
    np.put_along_axis(out[_corner(index, axis)], idx, values, axis=axis)


_UFUNC_AT = {"add": np.add, "multiply": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_reduce(
    op: str, x: Array, axis: int, index: Array, src: Array | int | float, out: Array
) -> None:
    """``out = x`` with ``src`` combined by ``op`` at ``index`` along ``axis``; NumPy's
    ``ufunc.at`` visits the entries in index order, so duplicates combine deterministically."""
    idx = _checked_index(index, x.shape[axis], "scatter")
    np.copyto(out, x)
    if isinstance(src, np.ndarray):
        values = src[tuple(slice(0, d) for d in index.shape)]
    else:
        values = np.full(index.shape, src, dtype=out.dtype)
    where: list[Any] = list(np.indices(index.shape, sparse=True))
    where[axis] = idx
    with np.errstate(all="ignore"):
        if out.dtype in _LOW:  # F16/BF16: combine in F32, round once
            wide = out.astype(np.float32)
            _UFUNC_AT[op].at(wide, tuple(where), values.astype(np.float32))
            out[...] = wide
        else:
            _UFUNC_AT[op].at(out, tuple(where), values)


def adam_update(
    p: Array,
    g: Array,
    m: Array,
    v: Array,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    weight_decay: float,
) -> None:
    ct = _compute_dtype(p)
    pf, gf, mf, vf = (t.astype(ct, copy=False) for t in (p, g, m, v))
    mf = beta1 * mf + (1 - beta1) * gf
    vf = beta2 * vf + (1 - beta2) * gf * gf
    m_hat = mf / (1 - beta1**step)
    v_hat = vf / (1 - beta2**step)
    upd = m_hat / (np.sqrt(v_hat) + eps)
    if weight_decay:
        upd = upd + weight_decay * pf
    _store(p, pf - lr * upd)
    _store(m, mf)
    _store(v, vf)
