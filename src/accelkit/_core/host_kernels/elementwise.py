"""NumPy bodies of elementwise ops, reductions and shape ops (inputs already validated).

F16 and BF16 are computed in F32 and rounded once when stored, as GPUs do. Composite activations
(GELU, SiLU, sigmoid) are chains of in-place passes, so they make no temporaries; ``unary`` asks
its ``accel`` (:class:`~accelkit._core.host_kernels.HostAccelerator`) first for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accelkit._core.host_arrays import _LOW, assign, cast_into, up
from accelkit._core.host_kernels import NUMPY_ONLY, HostAccelerator
from accelkit._core.host_stream import errors_ignored

__all__ = [
    "argsort", "assign", "binary", "cast_into", "cumulative", "reduce", "take", "unary", "where",
]  # fmt: skip

Array = np.ndarray[Any, Any]
_SQRT_2_OVER_PI = 0.7978845608028654


def preload() -> None:
    """Import now what these bodies import on first use (SciPy's special functions, for erf and
    the exact GELU): a backend's ``prepare`` calls it, so that no first request imports (an
    import holds the GIL for a fraction of a second)."""
    import importlib

    importlib.import_module("scipy.special")


def _erf(x: Array) -> Array:
    from scipy.special import erf  # type: ignore[import-untyped]  # SciPy ships no types

    return erf(x)  # type: ignore[no-any-return]  # (the same)


def _unary_float(op: str, x: Array, out: Array, accel: HostAccelerator) -> None:
    """x and out are F32 or F64 arrays of the same dtype: ``accel``'s kernel where it has one,
    else NumPy's."""
    if not accel.unary(op, x, out):
        _unary_numpy(op, x, out)


def _unary_numpy(op: str, x: Array, out: Array) -> None:
    """x and out are F32 or F64 arrays of the same dtype.

    Everything runs as in-place passes of NumPy's SIMD loops: on AVX-512 CPUs NumPy's exp and
    tanh are several times faster than numexpr's, and in-place passes make no temporaries.
    """
    if op in ("sigmoid", "silu"):
        np.negative(x, out=out)
        np.exp(out, out=out)
        out += 1
        if op == "sigmoid":
            np.reciprocal(out, out=out)
        else:
            np.divide(x, out, out=out)
    elif op == "gelu_tanh":
        # 0.5 x (1 + tanh(u)) == x * sigmoid(2u) with u = c0 (x + c1 x^3): seven in-place
        # passes of NumPy's SIMD loops, no temporaries.
        t = x.dtype.type
        np.multiply(x, x, out=out)
        out *= t(-2 * _SQRT_2_OVER_PI * 0.044715)
        out += t(-2 * _SQRT_2_OVER_PI)
        out *= x
        np.exp(out, out=out)
        out += 1
        np.divide(x, out, out=out)
    elif op == "gelu":
        out[...] = 0.5 * x * (1 + _erf(x * np.asarray(0.7071067811865476, x.dtype)))
    elif op == "erf":
        out[...] = _erf(x)
    elif op == "rsqrt":
        np.sqrt(x, out=out)
        np.reciprocal(out, out=out)
    else:
        getattr(np, op)(x, out=out)


_SAME = {"abs": np.abs, "neg": np.negative, "floor": np.floor, "ceil": np.ceil, "round": np.rint}


#: F32 and F64 zeros: ``np.maximum(x, zero, out=out)`` with a zero of x's own dtype skips
#: NumPy's weak-scalar promotion (about 2 us of a 64x64 relu).
_WIDE_ZERO: dict[np.dtype[Any], Any] = {
    np.dtype(np.float32): np.float32(0),
    np.dtype(np.float64): np.float64(0),
}


def unary(op: str, x: Array, out: Array, *, accel: HostAccelerator = NUMPY_ONLY) -> None:
    """``out = op(x)``; the float activations through ``accel`` where it takes them."""
    dt = x.dtype
    if dt is out.dtype and dt in _WIDE_ZERO:
        # F32 or F64 in and out, the common case: no conversion, and NumPy's error state is
        # already quiet where accelkit's streams run kernels (its context variable, or the
        # worker thread's own state); np.errstate costs about 1.5 us otherwise.
        if op == "relu":
            np.maximum(x, _WIDE_ZERO[dt], out=out)
            return
        if op in _SAME:
            _SAME[op](x, out=out)
            return
        if errors_ignored():
            _unary_float(op, x, out, accel)
        else:
            with np.errstate(all="ignore"):
                _unary_float(op, x, out, accel)
        return
    if op == "bitwise_not":
        np.invert(x, out=out)
        return
    if op == "relu":
        if x.dtype.kind in "ub":
            out[...] = x
        else:
            np.maximum(x, 0, out=out, casting="unsafe")
        return
    if op in _SAME:
        if x.dtype.kind in "iub" and op in ("floor", "ceil", "round"):
            out[...] = x
        elif x.dtype in _LOW:
            out[...] = _SAME[op](x.astype(np.float32))
        else:
            _SAME[op](x, out=out)
        return
    with np.errstate(all="ignore"):
        if out.dtype in _LOW:
            tmp = np.empty(out.shape, np.float32)
            _unary_float(op, x.astype(np.float32), tmp, accel)
            out[...] = tmp
        elif x.dtype != out.dtype:
            _unary_float(op, x.astype(out.dtype), out, accel)
        else:
            _unary_float(op, x, out, accel)


_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "maximum": np.maximum, "minimum": np.minimum, "mod": np.mod,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "floor_divide": np.floor_divide,
    "fmod": np.fmod, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor, "left_shift": np.left_shift, "right_shift": np.right_shift,
}  # fmt: skip
#: Ops whose integer or float forms may divide by zero or overflow: NumPy's results (x // 0 and
#: x fmod 0 are 0 for integers, INT_MIN // -1 wraps) without its warnings.
_QUIET = frozenset({"div", "mod", "floor_divide", "fmod"})


def _operand(v: Any, dtype: np.dtype[Any]) -> Any:
    """Bring an operand to the computation dtype (Python scalars stay weak)."""
    if isinstance(v, np.ndarray):
        return v if v.dtype == dtype else v.astype(dtype)
    return v


def _compare(fn: Any, a: Any, b: Any, out: Array) -> None:
    """A comparison: two arrays of different dtypes in their promoted dtype
    (:func:`accelkit.dtype.result_type`: U64 with a signed integer in I64, an integer with a
    float in the float's dtype), as every backend compares them, through the ufunc's loop for
    that dtype (no copies); a Python scalar keeps its exact value (NumPy's weak scalars)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype != b.dtype:
        from accelkit.dtype import DType, result_type

        t = result_type(DType.from_any(a.dtype), DType.from_any(b.dtype)).to_numpy()
        with np.errstate(all="ignore"):  # an integer beyond F16's range rounds to inf
            if t in _LOW or a.dtype in _LOW or b.dtype in _LOW:
                fn(up(a.astype(t, copy=False)), up(b.astype(t, copy=False)), out=out)
            else:
                fn(a, b, out=out, signature=(t, t, np.dtype(np.bool_)), casting="unsafe")
        return
    fn(up(a), up(b), out=out)


def binary(op: str, a: Any, b: Any, out: Array) -> None:
    """``a``/``b`` are arrays or Python scalars; ``out`` has the result dtype, in which the
    arrays are combined (NumPy's own promotion differs: U64 with I64 in F64)."""
    if op == "pow":
        _pow(a, b, out)
        return
    fn = _BINARY[op]
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        _compare(fn, a, b, out)
        return
    if out.dtype in _LOW:
        with np.errstate(all="ignore"):  # IEEE results (inf, nan), silently, as for F32
            out[...] = fn(_operand(a, np.dtype(np.float32)), _operand(b, np.dtype(np.float32)))
        return
    if op in _QUIET:
        with np.errstate(all="ignore"):
            fn(_operand(a, out.dtype), _operand(b, out.dtype), out=out)
        return
    fn(a, b, out=out, dtype=out.dtype, casting="unsafe")  # in the result's dtype: U64 + I64 wraps


def _pow(a: Any, b: Any, out: Array) -> None:
    if out.dtype.kind in "iu":
        # Integer powers: negative exponents truncate toward zero (1, -1 or 0), never raise.
        ai, bi = _operand(a, out.dtype), _operand(b, out.dtype)
        if out.dtype.kind == "i":
            bneg = np.less(bi, 0)
            safe_b = np.where(bneg, 0, bi)
            res = np.power(ai, safe_b)
            ones = np.equal(ai, 1) | (np.equal(ai, -1) & (np.remainder(bi, 2) == 0))
            minus = np.equal(ai, -1) & (np.remainder(bi, 2) != 0)
            res = np.where(bneg, np.where(ones, 1, np.where(minus, -1, 0)), res)
            out[...] = res
        else:
            np.power(ai, bi, out=out)
        return
    with np.errstate(all="ignore"):
        if out.dtype in _LOW:
            out[...] = np.power(
                _operand(a, np.dtype(np.float32)), _operand(b, np.dtype(np.float32))
            )
        else:
            np.power(_operand(a, out.dtype), _operand(b, out.dtype), out=out)


def where(cond: Array, a: Any, b: Any, out: Array) -> None:
    out[...] = np.where(cond, _operand(a, out.dtype), _operand(b, out.dtype))


def reduce(op: str, x: Array, axes: tuple[int, ...], keepdims: bool, out: Array) -> None:
    xu = up(x)
    if op in ("argmax", "argmin"):
        fn = np.argmax if op == "argmax" else np.argmin
        if len(axes) == x.ndim and x.ndim != 1:
            out[...] = np.reshape(fn(xu.reshape(-1)), out.shape)
        else:
            out[...] = fn(xu, axis=axes[0], keepdims=keepdims) if x.ndim else 0
        return
    res: Any
    if op == "mean" and x.size == 0:
        out.fill(np.nan)  # the mean of nothing, without NumPy's "empty slice" warning
        return
    if op == "mean":
        # Integers sum exactly in float64 (to 2**53), then round once to the F32 result.
        acc = np.float64 if x.dtype == np.float64 or x.dtype.kind in "iub" else np.float32
        with np.errstate(all="ignore"):
            res = np.mean(xu, axis=axes, keepdims=keepdims, dtype=acc)
    elif op in ("sum", "prod"):
        acc = out.dtype if out.dtype.kind in "iu" else xu.dtype
        if acc is out.dtype:
            # Straight into out: the ufunc's reduction that np.sum and np.prod call, without
            # their wrapper and the copy of a temporary result (half the time of a small sum).
            (np.add if op == "sum" else np.multiply).reduce(
                xu, axis=axes, dtype=acc, out=out, keepdims=keepdims
            )
            return
        if op == "sum":
            res = np.sum(xu, axis=axes, keepdims=keepdims, dtype=acc)
        else:
            res = np.prod(xu, axis=axes, keepdims=keepdims, dtype=acc)
    elif xu.dtype is out.dtype:
        # np.max and np.min are these reductions (NaN propagates the same way), into out.
        (np.maximum if op == "max" else np.minimum).reduce(
            xu, axis=axes, out=out, keepdims=keepdims
        )
        return
    else:
        res = (np.max if op == "max" else np.min)(xu, axis=axes, keepdims=keepdims)
    out[...] = res


def take(x: Array, axis: int, index: Array | range, out: Array) -> None:
    """``np.take``; an evenly spaced index (flip, a strided narrow, a broadcast) is a slice or
    a broadcast instead, several times faster than gathering through the index."""
    if isinstance(index, range):
        where_r: list[Any] = [slice(None)] * x.ndim
        stop: int | None = index.stop if index.stop >= 0 else None
        where_r[axis] = slice(index.start, stop, index.step)
        np.copyto(out, x[tuple(where_r)])
        return
    n = len(index)
    if n > 1:
        step = int(index[1] - index[0])
        if np.all(np.diff(index) == step):
            where: list[Any] = [slice(None)] * x.ndim
            if step == 0:
                where[axis] = slice(int(index[0]), int(index[0]) + 1)
                np.copyto(out, x[tuple(where)])  # broadcasts along the axis
                return
            stop = int(index[-1]) + (1 if step > 0 else -1)
            where[axis] = slice(int(index[0]), stop if stop >= 0 else None, step)
            np.copyto(out, x[tuple(where)])
            return
    np.take(x, index, axis=axis, out=out)


def cumulative(op: str, x: Array, axis: int, exclusive: bool, reverse: bool, out: Array) -> None:
    """Running sum or product; integers accumulate in out's dtype (wrapping), F16/BF16 in F32."""
    acc = np.dtype(np.float32) if out.dtype in _LOW else out.dtype
    xs = np.flip(x, axis) if reverse else x
    fn = np.cumsum if op == "sum" else np.cumprod
    with np.errstate(all="ignore"):
        res = fn(up(xs), axis=axis, dtype=acc)
    if exclusive and res.shape[axis]:
        res = np.concatenate(
            [np.full_like(np.take(res, [0], axis), 0 if op == "sum" else 1),
             np.take(res, np.arange(res.shape[axis] - 1), axis)],
            axis,
        )  # fmt: skip
    out[...] = np.flip(res, axis) if reverse else res


def argsort(x: Array, axis: int, descending: bool, out: Array) -> None:
    """Stable; NumPy puts NaN last. Descending sorts the reversed axis and maps back, which
    keeps ties in their original order and puts NaN first."""
    xu = up(x)
    if not descending:
        out[...] = np.argsort(xu, axis=axis, kind="stable")
        return
    n = x.shape[axis]
    rev = np.argsort(np.flip(xu, axis), axis=axis, kind="stable")
    out[...] = (n - 1) - np.flip(rev, axis)
