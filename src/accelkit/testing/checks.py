"""What the conformance tests share: dtype lists, tolerances, input data and comparisons."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import DType, Tensor
from accelkit.abc.backend import ComputeBackend

FLOATS = [DType.F32, DType.F64, DType.F16, DType.BF16]
SIGNED = [DType.I8, DType.I16, DType.I32, DType.I64]
UNSIGNED = [DType.U8, DType.U16, DType.U32, DType.U64]
INTS = SIGNED + UNSIGNED
ALL_DTYPES = FLOATS + INTS + [DType.BOOL]

#: (rtol, atol) against a float64 reference computed from the exact (already rounded) inputs:
#: the one tolerance table of the suite (:data:`FUSED_TOLERANCES` for fused KernelOps).
TOLERANCES: dict[DType, tuple[float, float]] = {
    DType.F64: (1e-10, 1e-12),
    DType.F32: (2e-5, 2e-6),
    DType.F16: (1e-2, 2e-3),
    DType.BF16: (2e-2, 1e-2),
}


#: (rtol, atol) for fused KernelOps results (whole-row reductions and attention, computed in F32
#: for F16/BF16 and rounded once) against a float64 reference.
FUSED_TOLERANCES: dict[DType, tuple[float, float]] = {
    DType.F64: (1e-9, 1e-9),
    DType.F32: (1e-5, 1e-5),
    DType.F16: (3e-3, 3e-3),
    DType.BF16: (2e-2, 2e-2),
}


def ids(values: list[DType]) -> list[str]:
    return [d.value for d in values]


def require_dtype(backend: ComputeBackend, *dtypes: DType) -> None:
    """Skip unless the backend claims every dtype."""
    missing = [d.value for d in dtypes if d not in backend.capabilities.dtypes]
    if missing:
        pytest.skip(f"{backend.name} does not claim dtype(s) {', '.join(missing)}")


def require_op(backend: ComputeBackend, *ops: str) -> None:
    """Skip unless the backend claims every op."""
    missing = [o for o in ops if o not in backend.capabilities.ops]
    if missing:
        pytest.skip(f"{backend.name} does not claim op(s) {', '.join(missing)}")


def tol(dtype: DType, scale: float = 1.0) -> dict[str, float]:
    """Tolerances for ``dtype`` (integers and bool must match exactly); ``scale`` widens them."""
    if dtype in TOLERANCES:
        rtol, atol = TOLERANCES[dtype]
        return {"rtol": rtol * scale, "atol": atol * scale}
    return {"rtol": 0.0, "atol": 0.0}


def sample(
    shape: tuple[int, ...] | int,
    dtype: DType,
    *,
    low: float = -2.0,
    high: float = 2.0,
    seed: int = 0,
) -> np.ndarray[Any, Any]:
    """A host array of ``dtype`` with values in [low, high] (integers are clipped to the dtype)."""
    rng = np.random.default_rng(seed)
    npd = dtype.to_numpy()
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_integer:
        info = np.iinfo(npd)
        lo, hi = max(int(low), int(info.min)), min(int(high), int(info.max))
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(npd)
    return rng.uniform(low, high, size=shape).astype(npd)


def f64(a: Any) -> np.ndarray[Any, Any]:
    return np.asarray(a).astype(np.float64)


async def fetch(t: Tensor, dtype: DType | None = None) -> np.ndarray[Any, Any]:
    """The tensor's host copy, after checking that the array agrees with the tensor's metadata
    (and with ``dtype`` if given)."""
    assert isinstance(t, Tensor), f"expected a Tensor, got {type(t).__name__}"
    if dtype is not None:
        assert t.dtype is dtype, f"dtype {t.dtype} != expected {dtype}"
    a = await t.to_host()
    assert isinstance(a, np.ndarray)
    assert a.shape == t.shape, f"host shape {a.shape} != tensor shape {t.shape}"
    assert a.dtype == t.dtype.to_numpy(), f"host dtype {a.dtype} != {t.dtype.to_numpy()}"
    return a


def assert_close(
    actual: Any,
    expected: Any,
    dtype: DType,
    *,
    scale: float = 1.0,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Compare in float64 with ``dtype``'s tolerances (exact for integers and bool)."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    t = tol(dtype, scale)
    if rtol is not None:
        t["rtol"] = rtol
    if atol is not None:
        t["atol"] = atol
    if dtype.is_floating:
        np.testing.assert_allclose(f64(a), f64(e), rtol=t["rtol"], atol=t["atol"], equal_nan=True)
    else:
        np.testing.assert_array_equal(a, e)


def gemm_error_bound(
    a: Any, b: Any, *, alpha: float = 1.0, add: Any = None, dtype: Any = np.float32
) -> np.ndarray[Any, Any]:
    """A componentwise bound on the rounding error of ``alpha * (a @ b) + add`` computed in
    ``dtype`` from exact inputs, whatever the order of the sums and with or without FMA:
    ``gamma(K + 2) * (|alpha| |a| |b| + |add|)``, where ``gamma(n) = n u / (1 - n u)`` and ``u``
    is the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1 and
    3.5; the two extra terms cover the scaling and the addition). It holds on every machine
    and BLAS, and is far below the size of a wrong term (one missing product ``a_ik b_kj``)."""
    a64, b64 = np.abs(f64(a)), np.abs(f64(b))
    k = a64.shape[-1] + 2
    u = float(np.finfo(dtype).eps) / 2
    gamma = k * u / (1 - k * u)
    size = abs(alpha) * (a64 @ b64)
    if add is not None:
        size = size + np.abs(f64(add))
    return np.asarray(gamma * size)


def assert_gemm_close(
    got: Any, a: Any, b: Any, *, alpha: float = 1.0, add: Any = None, dtype: Any = np.float32
) -> None:
    """``got`` is ``alpha * (a @ b) + add`` (computed in float64 from the same inputs) within
    :func:`gemm_error_bound`, element by element."""
    want = alpha * (f64(a) @ f64(b))
    if add is not None:
        want = want + f64(add)
    got64 = f64(got)
    assert got64.shape == want.shape, f"shape {got64.shape} != expected {want.shape}"
    bound = gemm_error_bound(a, b, alpha=alpha, add=add, dtype=dtype)
    error = np.abs(got64 - want)
    bad = ~(error <= bound)
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, error - bound, -np.inf))), bad.shape)
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} elements past the rounding-error bound; worst at"
            f" {tuple(int(j) for j in i)}: {got64[i]!r} against {want[i]!r} (error"
            f" {error[i]:.3g}, bound {bound[i]:.3g})"
        )
