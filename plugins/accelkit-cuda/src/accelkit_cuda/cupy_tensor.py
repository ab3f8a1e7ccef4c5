"""CuPy kernels for the TensorOps hooks (inputs already validated by the core).

The same numerics as the CPU backend's NumPy kernels: F16 is computed in F32 and rounded once
when stored; casts follow C semantics with NaN and out-of-range values becoming 0; integer powers
with negative exponents truncate toward zero. GEMMs go to cuBLAS through ``cupy.matmul`` (F16
inputs with F32 accumulation: CuPy's default compute type for half matmul is F32).
"""

from __future__ import annotations

import math
from typing import Any

import cupy as cp
import cupyx.scipy.special as cps
import numpy as np

from accelkit.dtype import DType, result_type
from accelkit_cuda import blas, division

__all__ = [
    "adam_update", "argsort", "attention", "binary", "cast_into", "conv2d", "cross_entropy",
    "cumulative", "gemm", "take",
    "layer_norm", "matmul", "put_last", "range_flag", "reduce", "rms_norm", "softmax", "unary",
    "where",
]  # fmt: skip

Array = Any
_F16 = cp.dtype(cp.float16)
#: bfloat16 (ml_dtypes; CuPy 14 holds it), or None. BF16 arrays meet only copies, casts and
#: cuBLAS: everything else is computed in F32 and rounded once when stored.
_BF16: Any = None
try:
    import ml_dtypes

    _BF16 = cp.dtype(ml_dtypes.bfloat16)
except (ImportError, TypeError):  # pragma: no cover - ml_dtypes missing
    pass


def half(dtype: Any) -> bool:
    """F16 or BF16: stored narrow, computed in F32."""
    return dtype == _F16 or (_BF16 is not None and dtype == _BF16)


_SQRT_2_OVER_PI = 0.7978845608028654
_ATTN_CHUNK_ELEMS = 1 << 26  # score elements per chunk (256 MiB of f32)


def up(x: Any) -> Any:
    return x.astype(cp.float32) if isinstance(x, cp.ndarray) and half(x.dtype) else x


def _ct(x: Array) -> Any:
    return cp.dtype(cp.float32) if x.dtype == _F16 or x.dtype.kind != "f" else x.dtype


def _store(out: Array, value: Any) -> None:
    if isinstance(value, cp.ndarray) and value.dtype == out.dtype and value.shape == out.shape:
        cp.copyto(out, value)
    else:
        out[...] = value


# -- elementwise ------------------------------------------------------------------------------------
_SIMPLE = {
    "tanh": cp.tanh, "exp": cp.exp, "log": cp.log, "sqrt": cp.sqrt, "sin": cp.sin,
    "cos": cp.cos, "tan": cp.tan, "erf": cps.erf,
}  # fmt: skip


def _float_unary(op: str, x: Array) -> Array:
    if op == "sigmoid":
        return 1 / (1 + cp.exp(-x))
    if op == "silu":
        return x / (1 + cp.exp(-x))
    if op == "gelu":
        return 0.5 * x * (1 + cps.erf(x * 0.7071067811865476))
    if op == "gelu_tanh":
        return 0.5 * x * (1 + cp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    if op == "rsqrt":
        return 1 / cp.sqrt(x)
    return _SIMPLE[op](x)


_SAME = {"abs": cp.abs, "neg": cp.negative, "floor": cp.floor, "ceil": cp.ceil, "round": cp.rint}


def unary(op: str, x: Array, out: Array) -> None:
    if _BF16 is not None and x.dtype == _BF16:
        tmp = cp.empty(out.shape, cp.float32)
        unary(op, up(x), tmp)
        _store(out, tmp)
        return
    if op == "bitwise_not":
        cp.invert(x, out=out)
        return
    if op == "relu":
        if x.dtype.kind in "ub":
            cp.copyto(out, x)
        else:
            cp.maximum(x, 0, out=out, casting="unsafe")
        return
    if op in _SAME:
        if x.dtype.kind in "iub" and op in ("floor", "ceil", "round"):
            cp.copyto(out, x)
        else:
            _SAME[op](x, out=out)
        return
    ct = out.dtype if out.dtype.kind == "f" and out.dtype != _F16 else cp.dtype(cp.float32)
    _store(out, _float_unary(op, x.astype(ct, copy=False)))


_BINARY = {
    "add": cp.add, "sub": cp.subtract, "mul": cp.multiply, "div": cp.true_divide,
    "maximum": cp.maximum, "minimum": cp.minimum, "mod": cp.mod,
    "eq": cp.equal, "ne": cp.not_equal, "lt": cp.less, "le": cp.less_equal,
    "gt": cp.greater, "ge": cp.greater_equal,
}  # fmt: skip
#: Ops called by their CuPy (and NumPy) name.
_BY_NAME = frozenset({"floor_divide", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor"})


def _operand(v: Any, dtype: Any) -> Any:
    """An array operand in the computation dtype; a Python scalar as a NumPy scalar of it (so
    CuPy's promotion cannot widen the result, and it travels as a kernel argument, not a copy)."""
    if isinstance(v, cp.ndarray):
        return v if v.dtype == dtype else v.astype(dtype)
    with np.errstate(all="ignore"):
        return np.array(v).astype(dtype)[()]


def _compared(a: Any, b: Any) -> tuple[Any, Any]:
    """A comparison's operands: two arrays of different dtypes in their promoted dtype
    (accelkit's ``result_type``: U64 with a signed integer in I64, an integer with a float in
    the float's dtype), as every backend compares them (CuPy's promotion compared U64 with I64,
    and an integer with F32, in F64); a Python scalar keeps its exact value."""
    if isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray) and a.dtype != b.dtype:
        t = result_type(DType.from_any(a.dtype), DType.from_any(b.dtype)).to_numpy()
        with np.errstate(all="ignore"):
            return up(a.astype(t, copy=False)), up(b.astype(t, copy=False))
    return up(a), up(b)


def binary(op: str, a: Any, b: Any, out: Array) -> None:
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        _BINARY[op](*_compared(a, b), out=out)
        return
    ct = cp.dtype(cp.float32) if half(out.dtype) else out.dtype
    av, bv = _operand(a, ct), _operand(b, ct)
    if op == "pow":
        if ct.kind == "i":
            bneg = bv < 0
            res = cp.power(av, cp.where(bneg, 0, bv))
            ones = (av == 1) | ((av == -1) & (bv % 2 == 0))
            minus = (av == -1) & (bv % 2 != 0)
            res = cp.where(bneg, cp.where(ones, 1, cp.where(minus, -1, 0)), res)
        else:
            res = cp.power(av, bv)
    elif op == "mod" and ct.kind == "i":
        # x mod 0 and x mod -1 are 0 (C's % is undefined for INT_MIN % -1 and for 0)
        special = (bv == 0) | (bv == -1)
        res = cp.where(special, 0, cp.mod(av, cp.where(special, 1, bv)))
    elif op == "mod" and ct.kind == "u":
        res = cp.where(bv == 0, 0, cp.mod(av, cp.where(bv == 0, 1, bv)))
    elif op == "fmod" and ct.kind in "iu":
        res = division.int_fmod(av, bv)  # CuPy's goes through double: wrong past 2**53
    elif op in ("floor_divide", "mod") and ct.kind == "f":
        # NumPy's npy_divmod: 1 // 0.1 is 9, -5 mod inf is inf (CuPy: 10 and NaN)
        res = (division.floor_divide if op == "floor_divide" else division.remainder)(av, bv)
    elif op == "floor_divide" and ct.kind in "iu":
        # x // 0 is 0; INT_MIN // -1 wraps to INT_MIN (CUDA's division by 0 or
        # of INT_MIN by -1 is undefined, so neither reaches it)
        zero = bv == 0
        special = (zero | (bv == -1)) if ct.kind == "i" else zero
        safe = cp.where(special, 1, bv)
        res = cp.floor_divide(av, safe)
        if ct.kind == "i":
            res = cp.where(bv == -1, cp.negative(av), res)
        res = cp.where(zero, 0, res)
    elif op in ("left_shift", "right_shift"):
        # Counts outside 0..bits-1 shift every bit out (C++ leaves them undefined).
        inside = (bv >= 0) & (bv < 8 * ct.itemsize)
        shift = cp.left_shift if op == "left_shift" else cp.right_shift
        res = shift(av, cp.where(inside, bv, 0))
        fill = cp.where(av < 0, -1, 0) if op == "right_shift" and ct.kind == "i" else 0
        res = cp.where(inside, res, fill)
    elif op in _BY_NAME:
        res = getattr(cp, op)(av, bv)
    else:
        res = _BINARY[op](av, bv)
    _store(out, res)


def where(cond: Array, a: Any, b: Any, out: Array) -> None:
    ct = cp.dtype(cp.float32) if _BF16 is not None and out.dtype == _BF16 else out.dtype
    _store(out, cp.where(cond, _operand(a, ct), _operand(b, ct)))


def cast_into(x: Array, out: Array) -> None:
    if _BF16 is not None and x.dtype == _BF16:
        x = up(x)  # exact
    if out.dtype.kind in "iu" and x.dtype.kind == "f":
        info = cp.iinfo(out.dtype)
        t = cp.trunc(x.astype(cp.float64))
        ok = cp.isfinite(t) & (t >= float(info.min)) & (t < float(info.max) + 1.0)
        _store(out, cp.where(ok, t, 0).astype(out.dtype))
        return
    if out.dtype == cp.bool_:
        cp.not_equal(x, 0, out=out)
        return
    _store(out, x.astype(out.dtype))


def reduce(op: str, x: Array, axes: tuple[int, ...], keepdims: bool, out: Array) -> None:
    xu = up(x)
    if op in ("argmax", "argmin"):
        fn = cp.argmax if op == "argmax" else cp.argmin
        if len(axes) == x.ndim and x.ndim != 1:
            _store(out, fn(xu.reshape(-1)).reshape(out.shape))
        elif x.ndim == 0:
            out[...] = 0
        else:
            res = fn(xu, axis=axes[0])
            _store(out, cp.expand_dims(res, axes[0]) if keepdims else res)
        return
    if op == "mean" and x.size == 0:
        out.fill(math.nan)
        return
    if op == "mean":
        # Integers sum exactly in float64 (to 2**53), then round once to the F32 result.
        acc = cp.float64 if x.dtype == cp.float64 or x.dtype.kind in "iub" else cp.float32
        res = cp.mean(xu, axis=axes, keepdims=keepdims, dtype=acc)
    elif op in ("sum", "prod"):
        acc = out.dtype if out.dtype.kind in "iu" else xu.dtype
        fn = cp.sum if op == "sum" else cp.prod
        res = fn(xu, axis=axes, keepdims=keepdims, dtype=acc)
    else:
        res = (cp.max if op == "max" else cp.min)(xu, axis=axes, keepdims=keepdims)
    _store(out, res)


def range_flag(index: Array, low: int, high: int) -> Array:
    """``[flag, first offending value]`` (int64, on the device) for values outside low..high-1."""
    if index.size == 0:
        return cp.zeros(2, cp.int64)
    flat = index.reshape(-1).astype(cp.int64)
    bad = (flat < low) | (flat >= high)
    first = flat[cp.argmax(bad)]
    return cp.stack([bad.any().astype(cp.int64), first])


# -- linear algebra -----------------------------------------------------------------------------------
def _mm(
    a: Array, b: Array, out: Array | None = None, tf32: bool = False, wide: bool = False
) -> Array:
    """``a @ b`` on cuBLAS. :func:`accelkit_cuda.blas.matmul` serves where it applies (every
    GEMM whose layout its direct cuBLAS call takes, and every GEMM while a CUDA graph is
    captured, where CuPy refuses its cuBLAS calls; ``ACCELKIT_CUDA_GEMM_WORKSPACE=0`` leaves
    eager ones but TF32's to CuPy); else ``cupy.matmul``, with BF16 operands multiplied in F32
    (CuPy 14 has no BF16 GEMM: its matmul takes BF16 for an integer type and fails), so a BF16
    product is rounded once, when stored. F16 stays on cuBLAS's F16 path (F32 accumulation).
    With ``wide``, F16/BF16 operands give an F32 result (not rounded to their type first:
    :func:`gemm` adds to it)."""
    res = blas.matmul(a, b, out, tf32, wide)
    if res is not None:
        if out is not None and res is not out:
            _store(out, res)
            return out
        return res
    if (_BF16 is not None and _BF16 in (a.dtype, b.dtype)) or (wide and half(a.dtype)):
        res = cp.matmul(a.astype(cp.float32), b.astype(cp.float32))
        if out is not None:
            _store(out, res)
            return out
        return res
    return cp.matmul(a, b) if out is None else cp.matmul(a, b, out=out)


def gemm(
    a: Array, b: Array, c: Array | None, out: Array, trans_a: bool, trans_b: bool, alpha: float,
    beta: float, tf32: bool = False,
) -> None:  # fmt: skip
    av = cp.swapaxes(a, -1, -2) if trans_a else a
    bv = cp.swapaxes(b, -1, -2) if trans_b else b
    if a.dtype != b.dtype:
        ct = cp.result_type(up(a), up(b))
        av, bv = av.astype(ct), bv.astype(ct)
    # F16/BF16 operands with a scale, an addend or a wider output: the product stays F32
    # (rounded once, when stored), not rounded to the operands' type first.
    wide = half(av.dtype) and (alpha != 1.0 or c is not None or out.dtype != av.dtype)
    res = _mm(av, bv, tf32=tf32, wide=wide)
    if alpha != 1.0 or c is not None:
        res = res.astype(cp.float32) if half(res.dtype) else res
        if alpha != 1.0:
            res = res * alpha
        if c is not None:
            res = res + beta * up(c)
    _store(out, res)


def matmul(a: Array, b: Array, out: Array, tf32: bool = False) -> None:
    """cuBLAS (:func:`_mm`): F16 and BF16 inputs with F32 accumulation."""
    if a.dtype != b.dtype:
        ct = cp.result_type(up(a), up(b))
        a, b = a.astype(ct), b.astype(ct)
    if a.dtype == out.dtype and (a.dtype.kind == "f" or half(a.dtype)) and out.flags.c_contiguous:
        _mm(a, b, out=out, tf32=tf32)
    else:
        _store(out, _mm(a, b, tf32=tf32))


def linear(x: Array, w: Array, bias: Array | None, out: Array, tf32: bool = False) -> None:
    """``x @ w.T (+ bias)``. Into ``out`` directly where it is contiguous and of ``x``'s dtype;
    an F32/F64 bias of that dtype is then added in place: two launches, no temporaries, and the
    same rounding as adding it to the product held in that dtype (PyTorch's cuBLASLt epilogue
    makes it one launch). F16/BF16 add their bias to the F32 product and round once."""
    if (
        bias is not None
        and out.dtype.kind == "f"
        and not half(out.dtype)
        and x.dtype == w.dtype == bias.dtype == out.dtype
        and out.flags.c_contiguous
    ):
        # F32/F64: the GEMM into ``out``, then the bias added in place (two launches, the
        # same arithmetic as adding to a temporary and copying it over)
        res = _mm(x, w.T, out, tf32)
        cp.add(res, bias, out=out)
        return
    direct = bias is None and out.dtype == x.dtype and out.flags.c_contiguous
    res = _mm(x, w.T, out if direct else None, tf32)
    if bias is not None:
        res = up(res) + up(bias)
    if res is not out:
        _store(out, res)


def conv2d(
    x: Array, w: Array, bias: Array | None, out: Array, stride: tuple[int, int],
    padding: tuple[int, int], dilation: tuple[int, int], groups: int,
) -> None:  # fmt: skip
    """im2col (strided views) and one batched cuBLAS matmul per group."""
    xf, wf = up(x), up(w)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if ph or pw:
        xf = cp.pad(xf, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = out.shape[2], out.shape[3]
    cols = cp.empty((n, groups, cg, kh, kw, oh, ow), xf.dtype)
    xg = xf.reshape(n, groups, cg, xf.shape[2], xf.shape[3])
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dh, j * dw
            cols[:, :, :, i, j] = xg[
                :, :, :, r0 : r0 + sh * (oh - 1) + 1 : sh, c0 : c0 + sw * (ow - 1) + 1 : sw
            ]
    cols = cols.reshape(n, groups, cg * kh * kw, oh * ow)
    wm = wf.reshape(groups, o // groups, cg * kh * kw)
    res = _mm(wm[None], cols).reshape(n, o, oh, ow)  # [N, G, O/G, OH*OW]
    if bias is not None:
        res = res + up(bias)[None, :, None, None]
    _store(out, res)


# -- neural-network ops -------------------------------------------------------------------------------
def softmax_rows(s: Array, log: bool = False, empty_rows: str = "zero") -> Array:
    """Stable (log-)softmax over the last axis of an F32/F64 array (a new array), with the
    special-value rule of docs/operations.md: a row holding a NaN or +inf is NaN; a row of only
    -inf is NaN with ``empty_rows="nan"`` (softmax) and zeros with ``"zero"`` (attention)."""
    if s.shape[-1] == 0:
        return s
    m = cp.max(s, axis=-1, keepdims=True)  # NaN where the row has one
    finite = cp.isfinite(m)
    nan_rows = ~finite if empty_rows == "nan" else ~(finite | (m == -cp.inf))
    m = cp.where(finite, m, 0)
    s = s - m
    if log:
        res = s - cp.log(cp.sum(cp.exp(s), axis=-1, keepdims=True))
    else:
        e = cp.exp(s)
        total = cp.sum(e, axis=-1, keepdims=True)
        res = cp.where(total > 0, e / cp.where(total > 0, total, 1), 0)
    return cp.where(nan_rows, cp.nan, res)


def softmax(x: Array, axis: int, out: Array, log: bool) -> None:
    s = cp.moveaxis(x, axis, -1).astype(_ct(x))
    _store(out, cp.moveaxis(softmax_rows(s, log, empty_rows="nan"), -1, axis))


def attention(
    q: Array, k: Array, v: Array, mask: Array | None, out: Array, scale: float, causal: bool,
    weights: Any = None,
) -> None:  # fmt: skip
    """Grouped-KV attention on cuBLAS, chunked over query rows (the fused flash kernel in
    KernelOps never materializes the scores at all). ``weights`` (the scores' softmax over
    their last axis, :func:`softmax_rows`'s ``empty_rows="zero"`` rule) replaces the composed
    softmax: the backend passes its one-launch kernel."""
    ct = _ct(q)
    b, h, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    grp = h // hk
    qg = (q.astype(ct) * scale).reshape(b, hk, grp, sq, d)
    kt = cp.swapaxes(k.astype(ct), -1, -2)[:, :, None]
    vg = v.astype(ct)[:, :, None]
    mk = None
    if mask is not None:
        mk = cp.broadcast_to(mask, (b, h, sq, sk)).reshape(b, hk, grp, sq, sk)
    rows = max(1, _ATTN_CHUNK_ELEMS // max(1, b * h * sk))
    res = cp.empty((b, hk, grp, sq, dv), ct)
    offset = sk - sq
    for r0 in range(0, sq, rows):
        r1 = min(sq, r0 + rows)
        s = _mm(qg[:, :, :, r0:r1], kt)
        if mk is not None:
            mc = mk[:, :, :, r0:r1]
            s = cp.where(mc, s, -cp.inf) if mc.dtype == cp.bool_ else s + up(mc)
        if causal:
            visible = cp.arange(sk)[None, :] <= cp.arange(r0, r1)[:, None] + offset
            s = cp.where(visible, s, -cp.inf)
        res[:, :, :, r0:r1] = _mm(softmax_rows(s) if weights is None else weights(s), vg)
    _store(out, res.reshape(b, h, sq, dv))


def layer_norm(x: Array, w: Array | None, bias: Array | None, eps: float, out: Array) -> None:
    xf = x.astype(_ct(x))
    res = xf - cp.mean(xf, axis=-1, keepdims=True)
    res = res / cp.sqrt(cp.mean(res * res, axis=-1, keepdims=True) + eps)
    if w is not None:
        res = res * up(w)
    if bias is not None:
        res = res + up(bias)
    _store(out, res)


def rms_norm(x: Array, w: Array | None, eps: float, out: Array) -> None:
    xf = x.astype(_ct(x))
    res = xf / cp.sqrt(cp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if w is not None:
        res = res * up(w)
    _store(out, res)


def cross_entropy(
    logits: Array, targets: Array, reduction: str, loss: Array, probs: Array
) -> Array:
    flag = range_flag(targets, 0, logits.shape[1])
    logp = softmax_rows(logits.astype(_ct(logits)), log=True, empty_rows="nan")
    safe = cp.clip(targets.astype(cp.int64), 0, max(0, logits.shape[1] - 1))
    picked = -cp.take_along_axis(logp, safe[:, None], axis=1)[:, 0] if logp.size else logp[:, 0]
    if reduction == "mean":
        _store(loss, picked.mean() if picked.size else math.nan)
    elif reduction == "sum":
        _store(loss, picked.sum())
    else:
        _store(loss, picked)
    _store(probs, cp.exp(logp))
    return flag


def embedding(indices: Array, weight: Array, out: Array) -> Array:
    flag = range_flag(indices, 0, weight.shape[0])
    safe = cp.clip(indices.astype(cp.int64), 0, max(0, weight.shape[0] - 1))
    if out.size:
        _store(out, cp.take(weight, safe, axis=0))
    return flag


def adam_update(
    p: Array, g: Array, m: Array, v: Array, lr: float, beta1: float, beta2: float, eps: float,
    step: int, weight_decay: float,
) -> None:  # fmt: skip
    ct = _ct(p)
    pf, gf, mf, vf = (t.astype(ct) for t in (p, g, m, v))
    mf = beta1 * mf + (1 - beta1) * gf
    vf = beta2 * vf + (1 - beta2) * gf * gf
    upd = (mf / (1 - beta1**step)) / (cp.sqrt(vf / (1 - beta2**step)) + eps)
    if weight_decay:
        upd = upd + weight_decay * pf
    _store(p, pf - lr * upd)
    _store(m, mf)
    _store(v, vf)


def _scatter_max(a: Array, index: Array, values: Array) -> None:
    if cp is np:  # the host tests run these bodies with NumPy standing in for CuPy
        np.maximum.at(a, index, values)
    else:
        import cupyx

        cupyx.scatter_max(a, index, values)


def put_last(region: Array, idx: Array, values: Array, axis: int) -> None:
    """``put_along_axis`` where duplicate indices keep the last write in index order (C order
    of ``idx``). Parallel writes have no order, so every entry writes the value of the last
    entry with its destination: duplicates then write the same value, on every run, and no
    host synchronization is needed (no boolean mask)."""
    coords = list(cp.indices(idx.shape))
    coords[axis] = idx
    flat = cp.ravel_multi_index(tuple(coords), region.shape).reshape(-1)
    last = cp.full(region.size, -1, cp.int64)
    _scatter_max(last, flat, cp.arange(flat.size))
    region[tuple(coords)] = values.reshape(-1)[last[flat]].reshape(idx.shape)


def take(x: Array, axis: int, index: Any, out: Array) -> None:
    """``np.take`` with the core's host index (computed from shapes); a ``range`` is a slice."""
    if isinstance(index, range):
        where: list[Any] = [slice(None)] * x.ndim
        where[axis] = slice(index.start, index.stop if index.stop >= 0 else None, index.step)
        cp.copyto(out, x[tuple(where)])
        return
    cp.copyto(out, cp.take(x, cp.asarray(index), axis=axis))


def cumulative(op: str, x: Array, axis: int, exclusive: bool, reverse: bool, out: Array) -> None:
    """Running sum or product; integers accumulate in out's dtype (wrapping), F16 in F32."""
    acc = cp.dtype(cp.float32) if half(out.dtype) else out.dtype
    xs = cp.flip(up(x), axis) if reverse else up(x)
    fn = cp.cumsum if op == "sum" else cp.cumprod
    res = fn(xs, axis=axis, dtype=acc)
    if exclusive and res.shape[axis]:
        head = cp.full_like(cp.take(res, cp.arange(1), axis=axis), 0 if op == "sum" else 1)
        rest = cp.take(res, cp.arange(res.shape[axis] - 1), axis=axis)
        res = cp.concatenate([head, rest], axis=axis)
    _store(out, cp.flip(res, axis) if reverse else res)


def argsort(x: Array, axis: int, descending: bool, out: Array) -> None:
    """CuPy's argsort is stable and puts NaN last; descending sorts the reversed axis and maps
    back, which keeps ties in order and puts NaN first (as the CPU backend does)."""
    xu = up(x)
    if not descending:
        cp.copyto(out, cp.argsort(xu, axis=axis))
        return
    n = x.shape[axis]
    rev = cp.argsort(cp.flip(xu, axis), axis=axis)
    cp.copyto(out, (n - 1) - cp.flip(rev, axis))


def warm_up(draws: bool = True) -> None:
    """Launch, once, on tiny arrays, the CuPy kernels and cuBLAS calls that common work needs:
    CuPy compiles (or loads from its disk cache) each kernel at its first launch and creates
    cuBLAS's handle at the first GEMM, holding the interpreter lock meanwhile (a stall of tens
    of milliseconds for the event loop, seen on an H100). Run on the submission thread during
    ``initialize``, so that the first request of a service does not pay it. ``draws``: CuPy's
    generator too (only where the Philox kernels did not load: it is their fallback)."""
    for dtype in (cp.float32, cp.float16):
        x = cp.ones((4, 8), dtype)
        w = cp.ones((8, 8), dtype)
        out = cp.empty((4, 8), dtype)
        out.fill(0)  # zeros, ones, full
        matmul(x, w, out)
        linear(x, w, None, out)
        for op in ("add", "sub", "mul", "div", "maximum"):
            binary(op, x, x, out)
        binary("mul", x, 2.0, out)
        for op in ("gelu", "gelu_tanh", "silu", "sigmoid", "exp", "tanh", "relu", "sqrt"):
            unary(op, x, out)
        for op in ("sum", "mean", "max", "min"):
            reduce(op, x, (1,), True, cp.empty((4, 1), dtype))
        softmax(x, 1, out, False)
        layer_norm(x, w[0], w[1], 1e-5, out)
        rms_norm(x, w[0], 1e-6, out)
    # The reductions of softmax and the norms at rows of each length class: CuPy picks a
    # reduction kernel's launch configuration (with its CUB accelerator, the block size: 32
    # threads up to rows of 128, 512 from 2048) from the row length, and builds a kernel per
    # configuration, so the (4, 8) rows above leave the rows of real work cold. F32: where
    # softmax and the norms compute (f16/bf16 are computed in f32).
    for cols in (256, 512, 1024, 4096):  # CUB blocks of 64, 128, 256, 512 threads
        x = cp.ones((2, cols), cp.float32)
        out = cp.empty_like(x)
        softmax(x, 1, out, False)
        softmax(x, 1, out, True)
        layer_norm(x, x[0], x[1], 1e-5, out)
        rms_norm(x, x[0], 1e-6, out)
        for op in ("sum", "mean", "max", "min"):
            reduce(op, x, (1,), True, cp.empty((2, 1), cp.float32))
    # uniform and normal as factory_kernels.device_draw's fallback draws them: a generator per
    # draw (its state's init kernel), the draw, then the scale and the offset in place
    for draw in ("random", "standard_normal") if draws else ():
        rng = cp.random.default_rng(0)
        x = getattr(rng, draw)(8, dtype=cp.float32)
        x *= 2.0
        x += 1.0
    cp.cuda.get_current_stream().synchronize()
