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
