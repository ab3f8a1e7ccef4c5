"""Floor division and remainders with NumPy's exact semantics, as CuPy elementwise kernels.

CuPy computes float ``floor_divide`` as ``floor(a / b)`` (``1 // 0.1`` is 10, NumPy says 9:
``1 / 0.1`` rounds up to exactly 10), float ``mod`` as ``a - floor(a / b) * b`` (``-5 mod inf``
is NaN, NumPy says inf) and integer ``fmod`` through ``double`` (wrong past 2**53). These
kernels follow NumPy's ``npy_divmod`` (numpy/_core/src/npymath/npy_math_internal.h.src) step
by step: ``mod = fmod(a, b)`` (exact in IEEE arithmetic), ``div = (a - mod) / b``, the
remainder moved to the divisor's sign, and the quotient snapped to the nearest integer.

:data:`SOURCE` is the one definition: CuPy compiles it (NVRTC) as the kernels' preamble, the
plugin's tests compile it with NVRTC and with the host's C++ compiler and compare the host build
with NumPy over tables of edge cases (inf, NaN, -0.0, subnormals, huge quotients, INT_MIN,
UINT64_MAX).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SOURCE", "floor_divide", "int_fmod", "remainder"]

#: Device functions over float/double (F16 is computed in F32 by the caller) and integers.
#: ``__device__`` is the only CUDA word in it, so a host compiler builds it with
#: ``-D__device__=``.
SOURCE = r"""
template <typename T>
__device__ T ak_floor_divide(T a, T b) {
    if (b == (T)0) {
        return a / b;  /* +-inf, or NaN for 0/0 and NaN/0 */
    }
    T mod = fmod(a, b);
    T div = (a - mod) / b;
    if (mod != (T)0) {  /* true for NaN, as C's `if (mod)` in NumPy */
        if ((b < (T)0) != (mod < (T)0)) {
            div -= (T)1;
        }
    }
    T floordiv;
    if (div != (T)0) {
        floordiv = floor(div);
        if (div - floordiv > (T)0.5) {
            floordiv += (T)1;
        }
    } else {
        floordiv = copysign((T)0, a / b);
    }
    return floordiv;
}

template <typename T>
__device__ T ak_remainder(T a, T b) {
    T mod = fmod(a, b);
    if (b == (T)0) {
        return mod;  /* NaN */
    }
    if (mod != (T)0) {
        if ((b < (T)0) != (mod < (T)0)) {
            mod += b;
        }
    } else {
        mod = copysign((T)0, b);
    }
    return mod;
}

/* C's truncating remainder in the integer type: x fmod 0 is 0, and so is x fmod -1 (where
   C leaves INT_MIN % -1 undefined). */
template <typename T>
__device__ T ak_int_fmod(T a, T b) {
    if (b == (T)0) {
        return (T)0;
    }
    if ((T)-1 < (T)0 && b == (T)-1) {
        return (T)0;
    }
    return (T)(a % b);
}
"""

_kernels: dict[str, Any] = {}


def _kernel(name: str) -> Any:
    kernel = _kernels.get(name)
    if kernel is None:
        import cupy

        kernel = cupy.ElementwiseKernel(
            "T a, T b", "T out", f"out = ak_{name}(a, b)", f"accelkit_{name}", preamble=SOURCE
        )
        _kernels[name] = kernel
    return kernel


def floor_divide(a: Any, b: Any) -> Any:
    """NumPy's float ``floor_divide`` (F32 or F64 operands of one dtype, broadcast)."""
    return _kernel("floor_divide")(a, b)


def remainder(a: Any, b: Any) -> Any:
    """NumPy's float ``remainder`` (``mod``): the sign of the divisor."""
    return _kernel("remainder")(a, b)


def int_fmod(a: Any, b: Any) -> Any:
    """C's integer remainder (``fmod``), exact in every integer dtype."""
    return _kernel("int_fmod")(a, b)
