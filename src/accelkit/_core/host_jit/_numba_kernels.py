"""Float32 kernels compiled by Numba: one pass per row or element where NumPy makes several.

Imported only by :mod:`accelkit._core.host_jit.jit`, which checks each kernel before using it.
Every kernel releases the GIL (``nogil``), so that jit.py can split rows between threads, and
keeps IEEE semantics: the fast-math flags allow reassociation (vectorised sums), contraction
(FMA) and reciprocals, never ``nnan`` or ``ninf``, so NaN and infinities mean what they do in
the NumPy kernels. ``error_model="numpy"`` drops Python's zero-division checks, which would
otherwise keep LLVM from vectorising the loops.

The exponential is a polynomial (Cephes' ``expf``: Cody-Waite range reduction and a degree-6
minimax polynomial, within 1 ulp over the normal range) with the power of two built from its
bits, so that loops over it vectorise; ``math.exp`` would be a scalar libm call per element.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

F = np.float32
_OPTS: dict[str, Any] = {
    "nogil": True,
    "cache": True,
    "fastmath": {"contract", "reassoc", "arcp"},
    "error_model": "numpy",
}
#: The exponential is inlined by Numba, so that its callers' loops vectorise around it.
_INLINE: dict[str, Any] = {**_OPTS, "inline": "always"}
del _INLINE["nogil"]

#: exp(x) is 0 below this (it rounds to zero in float32) and inf above _EXP_HI.
_EXP_LO = F(-103.972084)
_EXP_HI = F(88.72284)


@intrinsic
def _f32_from_bits(typingctx: Any, bits: Any) -> Any:
    if bits != types.int32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(**_INLINE)
def _exp(x: float) -> float:
    xc = min(max(x, _EXP_LO), _EXP_HI)
    n = np.floor(xc * F(1.44269504088896341) + F(0.5))
    r = xc - n * F(0.693359375) - n * F(-2.12194440e-4)
    p = F(1.9875691500e-4)
    p = p * r + F(1.3981999507e-3)
    p = p * r + F(8.3334519073e-3)
    p = p * r + F(4.1665795894e-2)
    p = p * r + F(1.6666665459e-1)
    p = p * r + F(5.0000001201e-1)
    p = p * r * r + r + F(1.0)
    # 2**n as two factors, each a normal float for n in -150..128: the product rounds once
    # into the subnormal range at the low end instead of needing a biased exponent below 1.
    ni = np.int32(n)
    n1 = ni >> np.int32(1)
    two1 = _f32_from_bits(np.int32((n1 + np.int32(127)) << np.int32(23)))
    two2 = _f32_from_bits(np.int32((ni - n1 + np.int32(127)) << np.int32(23)))
    y = p * two1 * two2
    y = F(0.0) if x < _EXP_LO else y
    y = F(np.inf) if x > _EXP_HI else y
    return x if x != x else y


@numba.njit(**_OPTS)
def exp(x: Any, out: Any) -> None:
    for i in range(x.size):
        out[i] = _exp(x[i])


@numba.njit(**_OPTS)
def sigmoid(x: Any, out: Any) -> None:
    for i in range(x.size):
        out[i] = F(1.0) / (F(1.0) + _exp(-x[i]))


@numba.njit(**_OPTS)
def silu(x: Any, out: Any) -> None:
    for i in range(x.size):
        v = x[i]
        out[i] = v / (F(1.0) + _exp(-v))


@numba.njit(**_OPTS)
def gelu_tanh(x: Any, out: Any) -> None:
    # 0.5 v (1 + tanh(u)) == v * sigmoid(2u), u = c (v + 0.044715 v^3), in the NumPy kernel's
    # order of operations, so that overflow and infinities come out the same.
    k1 = F(-2 * 0.7978845608028654 * 0.044715)
    k2 = F(-2 * 0.7978845608028654)
    for i in range(x.size):
        v = x[i]
        out[i] = v / (F(1.0) + _exp((v * v * k1 + k2) * v))


@numba.njit(**_INLINE)
def _weights(s: Any, lim: int) -> float:
    """The softmax of ``s[:lim]``, unnormalised, in place: returns 1 / the sum (the weights'
    scale), 0 for a row that sees no key or only -inf, NaN for a row that sees NaN or +inf."""
    m = F(-np.inf)
    for j in range(lim):
        m = s[j] if s[j] > m else m
    if m == F(-np.inf):
        for j in range(lim):
            if s[j] != s[j]:
                return F(np.nan)
        return F(0.0)
    total = F(0.0)
    for j in range(lim):
        e = _exp(s[j] - m)
        s[j] = e
        total += e
    return F(1.0) / total  # NaN where total is


@numba.njit(**_OPTS)
def softmax_rows(s: Any, out: Any, period: int, base: int, empty_nan: bool) -> None:
    """Softmax of each row of ``s`` (2-D) into ``out`` (which may be ``s``).

    With ``period`` > 0, row ``i`` sees keys ``0 .. (i % period) + base`` (a causal mask) and
    the keys past them come out 0. A row with a NaN or +inf among the keys it sees is NaN; a
    row that sees only -inf (or nothing) is NaN with ``empty_nan`` and zeros otherwise.

    Each row goes through a scratch row: with ``out`` being ``s``, LLVM's run-time overlap
    check would send a loop that reads one and writes the other to its scalar version.
    """
    n, k = s.shape
    row = np.empty(k, np.float32)
    empty = F(np.nan) if empty_nan else F(0.0)
    for i in range(n):
        lim = k
        if period > 0:
            lim = min(k, max(0, i % period + base + 1))
        for j in range(lim):
            row[j] = s[i, j]
        w = _weights(row, lim)
        if w != w or w == F(0.0):
            fill = empty if w == F(0.0) else w
            for j in range(k):
                out[i, j] = fill
            continue
        for j in range(lim):
            out[i, j] = row[j] * w
        for j in range(lim, k):
            out[i, j] = F(0.0)


@numba.njit(**_OPTS)
def layer_norm(x: Any, w: Any, b: Any, eps: float, out: Any) -> None:
    """Rows of ``x`` (2-D) normalised into ``out``; ``w`` and ``b`` are per-column, or empty
    for none. Sums accumulate in float64 (two passes: mean, then the centred squares)."""
    n, d = x.shape
    has_w, has_b = w.size > 0, b.size > 0
    for i in range(n):
        acc = 0.0
        for j in range(d):
            acc += x[i, j]
        mean = acc / d
        acc = 0.0
        for j in range(d):
            t = x[i, j] - mean
            acc += t * t
        rstd = F(1.0 / math.sqrt(acc / d + eps))
        m32 = F(mean)
        if has_w and has_b:
            for j in range(d):
                out[i, j] = (x[i, j] - m32) * rstd * w[j] + b[j]
        elif has_w:
            for j in range(d):
                out[i, j] = (x[i, j] - m32) * rstd * w[j]
        elif has_b:
            for j in range(d):
                out[i, j] = (x[i, j] - m32) * rstd + b[j]
        else:
            for j in range(d):
                out[i, j] = (x[i, j] - m32) * rstd


@numba.njit(**_OPTS)
def rms_norm(x: Any, w: Any, eps: float, out: Any) -> None:
    """Rows of ``x`` (2-D) divided by their root mean square, times ``w`` (empty for none)."""
    n, d = x.shape
    has_w = w.size > 0
    for i in range(n):
        acc = 0.0
        for j in range(d):
            v = np.float64(x[i, j])
            acc += v * v
        rstd = F(1.0 / math.sqrt(acc / d + eps))
        if has_w:
            for j in range(d):
                out[i, j] = x[i, j] * rstd * w[j]
        else:
            for j in range(d):
                out[i, j] = x[i, j] * rstd


@numba.njit(**_OPTS)
def attention(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    scale: float,
    causal: bool,
    heads: int,
    kv_heads: int,
    lo: int,
    hi: int,
) -> None:
    """Attention of the (batch, head) pairs ``lo .. hi`` of ``q`` [B*H, Sq, D] over ``k``
    [B*Hk, Sk, D] and ``v`` [B*Hk, Sk, Dv] into ``out`` [B*H, Sq, Dv], two query rows at a
    time: their scores stay in L1 and only the keys they see are computed (a causal row ``i``
    sees keys up to ``i + Sk - Sq``). Special values as :func:`softmax_rows` gives them with
    ``empty_nan`` False: a row that sees a NaN key is NaN, a row that sees no key is 0.

    The scores are built from a transposed copy of the head's keys, four dimensions per pass
    over the row of scores, and the weighted sum of values takes four keys per pass over the
    output row: every inner loop runs along contiguous memory with no sum across a vector, and
    a loaded key or value serves both rows (27 % faster than a dot product per key here).
    """
    sq, d = q.shape[1], q.shape[2]
    sk = k.shape[1]
    group = heads // kv_heads
    offset = sk - sq
    dv = v.shape[2]
    s0 = np.empty(sk, np.float32)
    s1 = np.empty(sk, np.float32)
    acc0 = np.empty(dv, np.float32)
    acc1 = np.empty(dv, np.float32)
    q0 = np.empty(d, np.float32)
    q1 = np.empty(d, np.float32)
    kt = np.empty((d, sk), np.float32)
    sc = F(scale)
    d4 = d - d % 4
    transposed = -1  # the key head in kt
    for bh in range(lo, hi):
        bk = (bh // heads) * kv_heads + (bh % heads) // group
        if bk != transposed:
            for j in range(sk):
                for t in range(d):
                    kt[t, j] = k[bk, j, t]
            transposed = bk
        for i in range(0, sq, 2):
            two = i + 1 < sq
            lim0 = min(sk, max(0, i + offset + 1)) if causal else sk
            lim1 = (min(sk, max(0, i + offset + 2)) if causal else sk) if two else 0
            mn = min(lim0, lim1)
            for t in range(d):
                q0[t] = q[bh, i, t] * sc
                q1[t] = q[bh, i + 1, t] * sc if two else F(0.0)
            for j in range(lim0):
                s0[j] = F(0.0)
            for j in range(lim1):
                s1[j] = F(0.0)
            # Scores: the keys both rows see, then the one more that a causal row i+1 sees.
            for t in range(0, d4, 4):
                a0, a1, a2, a3 = q0[t], q0[t + 1], q0[t + 2], q0[t + 3]
                b0, b1, b2, b3 = q1[t], q1[t + 1], q1[t + 2], q1[t + 3]
                for j in range(mn):
                    k0, k1, k2, k3 = kt[t, j], kt[t + 1, j], kt[t + 2, j], kt[t + 3, j]
                    s0[j] += a0 * k0 + a1 * k1 + a2 * k2 + a3 * k3
                    s1[j] += b0 * k0 + b1 * k1 + b2 * k2 + b3 * k3
                for j in range(mn, lim0):
                    s0[j] += (
                        a0 * kt[t, j] + a1 * kt[t + 1, j] + a2 * kt[t + 2, j] + a3 * kt[t + 3, j]
                    )
                for j in range(mn, lim1):
                    s1[j] += (
                        b0 * kt[t, j] + b1 * kt[t + 1, j] + b2 * kt[t + 2, j] + b3 * kt[t + 3, j]
                    )
            for t in range(d4, d):
                a0, b0 = q0[t], q1[t]
                for j in range(lim0):
                    s0[j] += a0 * kt[t, j]
                for j in range(lim1):
                    s1[j] += b0 * kt[t, j]
            w0 = _weights(s0, lim0)
            w1 = _weights(s1, lim1) if two else F(0.0)
            # out = weights @ V for both rows, four keys per pass.
            for t in range(dv):
                acc0[t] = F(0.0)
                acc1[t] = F(0.0)
            both = mn if w0 == w0 and w1 == w1 else 0
            both = both - both % 4
            for j in range(0, both, 4):
                e0, e1, e2, e3 = s0[j], s0[j + 1], s0[j + 2], s0[j + 3]
                f0, f1, f2, f3 = s1[j], s1[j + 1], s1[j + 2], s1[j + 3]
                for t in range(dv):
                    v0, v1, v2, v3 = v[bk, j, t], v[bk, j + 1, t], v[bk, j + 2, t], v[bk, j + 3, t]
                    acc0[t] += e0 * v0 + e1 * v1 + e2 * v2 + e3 * v3
                    acc1[t] += f0 * v0 + f1 * v1 + f2 * v2 + f3 * v3
            _finish(s0, lim0, both, w0, v, bk, acc0, out, bh, i)
            if two:
                _finish(s1, lim1, both, w1, v, bk, acc1, out, bh, i + 1)


@numba.njit(**_INLINE)
def _finish(
    s: Any, lim: int, start: int, w: float, v: Any, bk: int, acc: Any, out: Any, bh: int, i: int
) -> None:
    """Adds the keys ``start .. lim`` to ``acc`` and writes ``acc * w`` to ``out[bh, i]``."""
    dv = v.shape[2]
    if w != w or w == F(0.0):
        for t in range(dv):
            out[bh, i, t] = w  # NaN, or zeros for a row that sees nothing
        return
    for j in range(start, lim):
        e = s[j]
        for t in range(dv):
            acc[t] += e * v[bk, j, t]
    for t in range(dv):
        out[bh, i, t] = acc[t] * w
