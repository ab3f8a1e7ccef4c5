"""The CUDA backend's CuPy kernel bodies, run on the host with NumPy standing in for CuPy (their
array API is the same for these functions), so that their special-value rules are checked on a
machine without a GPU: softmax rows with NaN, +inf or only -inf, integer remainder at its edges
and the exact integer mean (docs/operations.md, "Special values"). test_gpu.py runs the real
thing where a GPU is present; the NVRTC kernels' versions are compile-checked by test_nvrtc.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cupy_tensor = pytest.importorskip("accelkit_cuda.cupy_tensor")

NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def numpy_for_cupy(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    monkeypatch.setattr(cupy_tensor, "cp", np)
    monkeypatch.setattr(cupy_tensor, "_F16", np.dtype(np.float16))
    # The op tables hold CuPy's functions: NumPy's of the same name instead.
    for table in ("_BINARY", "_SAME", "_SIMPLE"):
        funcs = getattr(cupy_tensor, table)
        monkeypatch.setattr(
            cupy_tensor,
            table,
            {k: getattr(np, f.__name__.removeprefix("cupy_"), f) for k, f in funcs.items()},
        )
    if "division" in request.keywords:  # the CUDA division kernels, built for the host
        monkeypatch.setattr(cupy_tensor, "division", request.getfixturevalue("host_division"))


def test_softmax_rows_follow_the_special_value_rule() -> None:
    rows = np.array(
        [[NAN, 1, 2], [INF, 1, 2], [-INF, -INF, -INF], [-INF, 0, 1], [1, 2, 3]], np.float32
    )
    with np.errstate(all="ignore"):
        out = np.empty_like(rows)
        cupy_tensor.softmax(rows, -1, out, False)
        attn = cupy_tensor.softmax_rows(rows.copy())  # attention's rule: a blind row is zeros
    assert np.isnan(out[:3]).all()
    e = np.exp(np.array([0.0, 1.0]))
    np.testing.assert_allclose(out[3], [0.0, *(e / e.sum())], rtol=1e-6)
    np.testing.assert_allclose(out[4], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum(), rtol=1e-6)
    assert np.isnan(attn[:2]).all()
    np.testing.assert_array_equal(attn[2], [0.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_mod_at_its_edges(dtype: Any) -> None:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    a = np.array([lo, hi, -7, 7, 5], dtype)
    b = np.array([-1, -1, 2, -2, 0], dtype)
    out = np.empty_like(a)
    cupy_tensor.binary("mod", a, b, out)
    np.testing.assert_array_equal(out, np.array([0, 0, 1, -1, 0], dtype))


def test_integer_mean_is_exact() -> None:
    x = np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max], np.int32)
    out = np.empty((), np.float32)
    cupy_tensor.reduce("mean", x, (0,), False, out)
    assert float(out) == -0.5


@pytest.mark.division
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
@pytest.mark.parametrize(
    "op", ["floor_divide", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor",
           "left_shift", "right_shift"],
)  # fmt: skip
def test_integer_ops_at_their_edges(op: str, dtype: Any) -> None:
    """Division by 0 and -1, INT_MIN, and shift counts outside 0..bits-1 give NumPy's values
    (the documented rule) without reaching CUDA's undefined cases."""
    info = np.iinfo(dtype)
    bits = 8 * np.dtype(dtype).itemsize
    signed = info.min < 0
    avals = [info.min, info.max, 7, 5, 1, 0] + ([-7, -1] if signed else [200 % (info.max + 1)])
    if op.endswith("shift"):
        bvals = [0, 1, bits - 1, bits, bits + 3] + ([-1, -bits] if signed else [])
    else:
        bvals = [0, 1, 3, 2] + ([-1, -2] if signed else [info.max])
    a = np.array([x for x in avals for _ in bvals], dtype)
    b = np.array([y for _ in avals for y in bvals], dtype)
    out = np.empty_like(a)
    cupy_tensor.binary(op, a, b, out)
    with np.errstate(all="ignore"):
        want = getattr(np, op)(a, b)
    np.testing.assert_array_equal(out, want)


def test_bitwise_not() -> None:
    x = np.array([0, 1, -128, 127], np.int8)
    out = np.empty_like(x)
    cupy_tensor.unary("bitwise_not", x, out)
    np.testing.assert_array_equal(out, [-1, -2, 127, -128])
    flags = np.array([True, False])
    res = np.empty_like(flags)
    cupy_tensor.unary("bitwise_not", flags, res)
    np.testing.assert_array_equal(res, [False, True])


@pytest.mark.parametrize("axis", [0, 1])
def test_put_last_keeps_the_last_duplicate_in_index_order(axis: int) -> None:
    """The CUDA scatter's rule for duplicate indices, against a loop over the index in order."""
    rng = np.random.default_rng(0)
    region = rng.standard_normal((4, 5))
    idx = rng.integers(0, region.shape[axis], (6, 5) if axis == 0 else (4, 7))
    values = rng.standard_normal(idx.shape)
    want = region.copy()
    for pos in np.ndindex(*idx.shape):
        dest = list(pos)
        dest[axis] = idx[pos]
        want[tuple(dest)] = values[pos]
    got = region.copy()
    cupy_tensor.put_last(got, idx, values, axis)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("descending", [False, True])
def test_argsort_is_stable_with_nan_largest(descending: bool) -> None:
    x = np.array([[2.0, NAN, 1.0, 2.0, -INF, NAN, 1.0]], np.float32)
    out = np.empty(x.shape, np.int64)
    cupy_tensor.argsort(x, 1, descending, out)
    key = [(1, 0.0) if v != v else (0, float(v)) for v in x[0]]
    order = sorted(range(7), key=lambda i: key[i], reverse=False)
    if descending:  # NaN first, larger first, ties in their original order
        order = sorted(range(7), key=lambda i: (0, 0.0) if x[0, i] != x[0, i] else (1, -x[0, i]))
    assert out[0].tolist() == order


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize(("exclusive", "reverse"), [(False, False), (True, False), (True, True)])
def test_cumulative_forms(op: str, exclusive: bool, reverse: bool) -> None:
    x = np.array([[1, 2, 3, 4], [-1, 5, 0, 2]], np.int32)
    out = np.empty(x.shape, np.int64)
    cupy_tensor.cumulative(op, x, 1, exclusive, reverse, out)
    want = np.empty_like(out)
    for r in range(2):
        row = x[r, ::-1] if reverse else x[r]
        acc, vals = (0 if op == "sum" else 1), []
        for v in row:
            if exclusive:
                vals.append(acc)
            acc = acc + int(v) if op == "sum" else acc * int(v)
            if not exclusive:
                vals.append(acc)
        want[r] = vals[::-1] if reverse else vals
    np.testing.assert_array_equal(out, want)


def test_take() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.empty((3, 3), np.float32)
    cupy_tensor.take(x, 1, np.array([3, 0, 0]), out)
    np.testing.assert_array_equal(out, x[:, [3, 0, 0]])
    cupy_tensor.take(x, 1, range(3, -1, -2), out[:, :2])
    np.testing.assert_array_equal(out[:, :2], x[:, [3, 1]])


@pytest.mark.parametrize("scalar", [0.1, np.float64(0.1), np.float32(0.1)])
def test_scalars_take_the_dtype_of_the_computation(
    scalar: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NumPy 2 / CuPy 14 promotion (NEP 50): a NumPy float64 or float32 scalar is not weak, so
    an f16 array times one would compute (and allocate) in f32 or f64. Every scalar reaches the
    kernel as a scalar of the computation dtype: f32 for f16 tensors, the array's own dtype
    otherwise, so results keep the dtype the core inferred, rounded once."""
    seen: list[tuple[Any, Any]] = []

    def mul(a: Any, b: Any, **kwargs: Any) -> Any:
        seen.append((np.result_type(a), np.result_type(b)))
        return np.multiply(a, b, **kwargs)

    monkeypatch.setitem(cupy_tensor._BINARY, "mul", mul)
    x16 = np.array([1.0, 2.0, 3.0], np.float16)
    out16 = np.empty(3, np.float16)
    cupy_tensor.binary("mul", x16, scalar, out16)
    x64 = np.array([1.0, 2.0, 3.0], np.float64)
    out64 = np.empty(3, np.float64)
    cupy_tensor.binary("mul", x64, scalar, out64)
    assert seen == [(np.float32, np.float32), (np.float64, np.float64)]
    expected = (x16.astype(np.float32) * np.float32(scalar)).astype(np.float16)
    np.testing.assert_array_equal(out16, expected)
    where16 = np.empty(3, np.float16)
    cupy_tensor.where(np.array([True, False, True]), x16, scalar, where16)
    np.testing.assert_array_equal(where16, np.array([1.0, 0.1, 3.0], np.float16))


def test_bf16_is_computed_in_f32_and_rounded_once() -> None:
    """BF16 tensors (CuPy 14 with ml_dtypes): every kernel body computes in F32 and rounds once
    when it stores, as the CPU backend does (NumPy with ml_dtypes stands in for CuPy here)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(bf)
    y = rng.standard_normal((8, 3)).astype(bf)
    xf = x.astype(np.float32)

    def out(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        return np.empty(shape, bf)

    got = out(x.shape)
    cupy_tensor.binary("mul", x, 0.1, got)
    np.testing.assert_array_equal(got, (xf * np.float32(0.1)).astype(bf))
    got = out(x.shape)
    cupy_tensor.unary("exp", x, got)
    np.testing.assert_array_equal(got, np.exp(xf).astype(bf))
    got = out(x.shape)
    cupy_tensor.unary("abs", x, got)
    np.testing.assert_array_equal(got, np.abs(x))
    got = out((4,))
    cupy_tensor.reduce("sum", x, (1,), False, got)
    np.testing.assert_array_equal(got, xf.sum(axis=1, dtype=np.float32).astype(bf))
    got = out((4, 3))
    cupy_tensor.matmul(x, y, got)
    np.testing.assert_allclose(
        got.astype(np.float32), xf @ y.astype(np.float32), rtol=1e-2, atol=1e-2
    )
    got = out(x.shape)
    cupy_tensor.layer_norm(x, None, None, 1e-5, got)
    mu = xf.mean(-1, keepdims=True)
    ref = (xf - mu) / np.sqrt(((xf - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    got = out(x.shape)
    cupy_tensor.softmax(x, -1, got, False)
    e = np.exp(xf - xf.max(-1, keepdims=True))
    np.testing.assert_allclose(got.astype(np.float32), e / e.sum(-1, keepdims=True), atol=1e-2)
    nan = np.array([np.nan, 2.7, -3.9, 1e10], bf)
    ints = np.empty(4, np.int32)
    cupy_tensor.cast_into(nan, ints)
    np.testing.assert_array_equal(ints, [0, 2, -3, 0])  # C semantics: NaN and out of range: 0


def test_host_arrays_never_reach_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    """With NumPy standing in for CuPy here, a GEMM the cuBLAS path would take (the workspace
    path switched on, TF32) stays on ``cp.matmul``: NumPy arrays are not CuPy's, and their
    ``.data`` is a memoryview (on the H100, with a real cuBLAS found, the bf16 GEMM of
    :func:`test_bf16_is_computed_in_f32_and_rounded_once` reached ``blas.matmul_into`` and
    failed with "cannot include dtype 'E' in a buffer")."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from accelkit_cuda import blas

    class Refusing:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"cuBLAS reached from host arrays: {name}")

    monkeypatch.setattr(blas, "_cublas", Refusing())
    monkeypatch.setenv("ACCELKIT_CUDA_GEMM_WORKSPACE", "1")
    rng = np.random.default_rng(0)
    for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)):
        x = rng.standard_normal((4, 8)).astype(dtype)
        y = rng.standard_normal((8, 3)).astype(dtype)
        got = np.empty((4, 3), dtype)
        cupy_tensor.matmul(x, y, got, tf32=True)
        want = x.astype(np.float64) @ y.astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        # U64 with I64 compares in I64 (2**64 - 1 is -1 there), as on every backend
        (np.array([2**64 - 1, 5], np.uint64), np.array([0, 5], np.int64), [True, False]),
        # an integer with an F32 tensor compares in F32 (16777217 is 16777216 there)
        (
            np.array([16777217, 3], np.int64),
            np.array([16777216.0, 2.5], np.float32),
            [False, False],
        ),
    ],
)
def test_a_comparison_of_two_dtypes_runs_in_the_promoted_one(
    a: Any, b: Any, want: list[bool]
) -> None:
    """CuPy's promotion compared them in F64 (exact, unlike every other backend)."""
    out = np.empty(2, bool)
    cupy_tensor.binary("lt", a, b, out)
    np.testing.assert_array_equal(out, want)
    cupy_tensor.binary("eq", a, b, out)
    np.testing.assert_array_equal(out, [False, True] if a.dtype == np.uint64 else [True, False])
