"""Float floor division and remainder, and integer fmod, of the CUDA backend (no GPU needed).

:data:`accelkit_cuda.division.SOURCE` is checked three ways: NVRTC compiles it for every dtype
the backend instantiates; the same text, built by the host's C++ compiler, gives NumPy's
results bit for bit over tables of edge cases and random operands; and a NumPy transcription of
NumPy's ``npy_divmod`` steps (the algorithm the source follows) agrees with NumPy's ufuncs, so a
machine without a C++ compiler still checks the arithmetic. test_gpu.py and the conformance suite
(test_integer_ops.py) run the kernels themselves where a GPU is present.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

division = pytest.importorskip("accelkit_cuda.division")

FLOATS = [np.float32, np.float64]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _float_edges(dtype: Any) -> np.ndarray[Any, Any]:
    fi = np.finfo(dtype)
    vals = [
        0.0, 1.0, 0.1, 0.3, 7.5, 2.0, 3.0, 5.0, 1 / 3, 1e-3, 1e3, 1e30,
        float(fi.tiny), float(fi.smallest_subnormal), float(fi.max), float(fi.eps),
        2.0 ** (fi.nmant + 1) + 2, np.inf, np.nan,
    ]  # fmt: skip
    with np.errstate(over="ignore"):
        pos = np.array(vals, np.float64).astype(dtype)
    return np.concatenate([pos, -pos])  # -0.0, -inf, -nan included


def _pairs(vals: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a, b = zip(*itertools.product(vals, vals), strict=True)
    return np.array(a, vals.dtype), np.array(b, vals.dtype)


def _random(dtype: Any, n: int = 20_000) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Operands over many magnitudes, quotients from tiny to huge, both signs."""
    rng = np.random.default_rng(27)
    exp_lo = -30 if dtype == np.float32 else -300
    mags = 10.0 ** rng.uniform(exp_lo / 3, -exp_lo / 3, (2, n))
    signs = rng.choice([-1.0, 1.0], (2, n))
    a, b = (signs * mags).astype(dtype)
    return a, b


def _assert_same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], what: str) -> None:
    """Equal values, NaN where NumPy has NaN, and the same sign of zero and infinity."""
    np.testing.assert_array_equal(got, want, err_msg=what)
    numbers = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]), what)


def _numpy(op: str, a: Any, b: Any) -> Any:
    with np.errstate(all="ignore"):
        return getattr(np, op)(a, b)


# -- the issue's cases --------------------------------------------------------------------------------
CASES = [  # (a, b, a // b, a mod b), NumPy's values
    (1.0, 0.1, 9.0, 0.09999999999999995),
    (np.inf, 2.0, np.nan, np.nan),
    (-5.0, np.inf, -1.0, np.inf),
    (5.0, np.inf, 0.0, 5.0),
    (-5.0, -np.inf, 0.0, -5.0),
    (1.0, 0.0, np.inf, np.nan),
    (-0.0, 3.0, -0.0, 0.0),
    (0.0, -3.0, -0.0, -0.0),
]


@pytest.mark.parametrize(("a", "b", "q", "r"), CASES)
def test_the_issue_cases_on_the_host_build(
    host_division: Any, a: float, b: float, q: float, r: float
) -> None:
    x, y = np.array([a]), np.array([b])
    _assert_same(host_division.floor_divide(x, y), np.array([q]), f"{a} // {b}")
    _assert_same(host_division.remainder(x, y), np.array([r]), f"{a} mod {b}")


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("op", "ufunc"), [("floor_divide", "floor_divide"), ("remainder", "mod")])
def test_float_kernels_match_numpy_bit_for_bit(
    host_division: Any, dtype: Any, op: str, ufunc: str
) -> None:
    for a, b in (_pairs(_float_edges(dtype)), _random(dtype)):
        got = getattr(host_division, op)(a, b)
        _assert_same(got, _numpy(ufunc, a, b), f"{op} {np.dtype(dtype).name}")


def test_f16_is_computed_in_f32_and_rounded_once(host_division: Any) -> None:
    a, b = _pairs(_float_edges(np.float16))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for op, ufunc in (("floor_divide", "floor_divide"), ("remainder", "mod")):
        with np.errstate(over="ignore"):  # huge quotients round to inf in F16, as NumPy's do
            got = getattr(host_division, op)(a32, b32).astype(np.float16)
            want = _numpy(ufunc, a32, b32).astype(np.float16)
        _assert_same(got, want, op)


def _int_edges(dtype: Any) -> np.ndarray[Any, Any]:
    info = np.iinfo(dtype)
    vals = [info.min, info.max, 0, 1, 2, 3, 7, 100, info.max - 1, info.min + 1]
    if info.min < 0:
        vals += [-1, -2, -7, -100]
    return np.array(vals, dtype)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
def test_int_fmod_is_exact_at_the_edges(host_division: Any, dtype: Any) -> None:
    """C's truncating remainder in the dtype (x fmod 0 = 0, INT_MIN fmod -1 = 0), against
    Python integers (an independent reference: NumPy's own int fmod is what CuPy got wrong)."""
    a, b = _pairs(_int_edges(dtype))
    got = host_division.int_fmod(a, b)
    want = [0 if y == 0 else (1 if x >= 0 else -1) * (abs(int(x)) % abs(int(y))) for x, y in
            zip(a.tolist(), b.tolist(), strict=True)]  # fmt: skip
    np.testing.assert_array_equal(got, np.array(want, dtype))
    # e.g. INT64_MIN fmod INT64_MAX = -1, which a double cannot tell from 0
    if dtype == np.int64:
        lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        assert host_division.int_fmod(np.array([lo]), np.array([hi]))[0] == -1


# -- NVRTC ------------------------------------------------------------------------------------------
def test_the_source_compiles_with_nvrtc_for_every_instantiated_type() -> None:
    from accelkit_cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NVRTCUnavailable as exc:
        pytest.skip(f"NVRTC is not installed: {exc}")
    types = {"f32": "float", "f64": "double", "i8": "signed char", "i16": "short",
             "i32": "int", "i64": "long long", "u8": "unsigned char", "u16": "unsigned short",
             "u32": "unsigned int", "u64": "unsigned long long"}  # fmt: skip
    kernels = []
    for tag, ct in types.items():
        ops = ("floor_divide", "remainder") if tag[0] == "f" else ("int_fmod",)
        for op in ops:
            kernels.append(
                f'extern "C" __global__ void t_{op}_{tag}(const {ct}* a, const {ct}* b, {ct}* o)'
                f" {{ o[threadIdx.x] = ak_{op}<{ct}>(a[threadIdx.x], b[threadIdx.x]); }}"
            )
    source = division.SOURCE + "\n".join(kernels) + "\n"
    compiled = nvrtc.compile_cuda(source, "sm_80", (), "accelkit_division.cu")
    assert compiled.kind == "cubin"
    for name in (k.split("void ")[1].split("(")[0] for k in kernels):
        assert name.encode() + b"\0" in compiled.binary, name
    assert "warning" not in compiled.log.lower(), compiled.log


# -- the algorithm, transcribed to NumPy ----------------------------------------------------------
def _npy_divmod(a: Any, b: Any) -> tuple[Any, Any]:
    """NumPy's npy_divmod (npy_math_internal.h.src), step by step, vectorized: the algorithm
    division.SOURCE follows, checked on machines without a C++ compiler."""
    with np.errstate(all="ignore"):
        mod = np.fmod(a, b)
        div = (a - mod) / b
        adjust = (mod != 0) & ((b < 0) != (mod < 0))
        mod = np.where(adjust, mod + b, mod)
        div = np.where(adjust, div - 1, div)
        mod = np.where(mod != 0, mod, np.copysign(np.zeros_like(b), b))
        floordiv = np.floor(div)
        floordiv = np.where(div - floordiv > 0.5, floordiv + 1, floordiv)
        floordiv = np.where(div != 0, floordiv, np.copysign(np.zeros_like(a), a / b))
        zero = b == 0
        floordiv = np.where(zero, a / b, floordiv)
        mod = np.where(zero, np.fmod(a, b), mod)
    return floordiv.astype(a.dtype), mod.astype(a.dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_the_algorithm_is_numpys(dtype: Any) -> None:
    for a, b in (_pairs(_float_edges(dtype)), _random(dtype)):
        q, r = _npy_divmod(a, b)
        _assert_same(q, _numpy("floor_divide", a, b), "floor_divide")
        _assert_same(r, _numpy("mod", a, b), "mod")
