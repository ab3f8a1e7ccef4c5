"""Matrix products: gemm (transposes, alpha, beta, broadcast c), batched_gemm, matmul (batched,
broadcasting, 1-d operands) and linear."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType, InvalidArgumentError

from .checks import FLOATS, assert_close, f64, fetch, ids, require_dtype, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

NUMERIC = [*FLOATS, DType.I32, DType.I64]


def _inputs(
    dtype: DType, *shapes: tuple[int, ...] | int, seed: int = 0
) -> list[np.ndarray[Any, Any]]:
    if dtype.is_floating:
        return [sample(s, dtype, low=-1, high=1, seed=seed + i) for i, s in enumerate(shapes)]
    return [sample(s, dtype, low=-4, high=4, seed=seed + i) for i, s in enumerate(shapes)]


def _scale(k: int) -> float:
    """Tolerance scale for sums of ``k`` products."""
    return max(1.0, k / 8)


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
async def test_gemm_transposes(
    backend: ComputeBackend, dtype: DType, trans_a: bool, trans_b: bool
) -> None:
    require_dtype(backend, dtype)
    m, k, n = 5, 7, 3
    a_h, b_h = _inputs(dtype, (k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n))
    f = backend.tensor_factory
    y = backend.tensor_ops.gemm(
        f.from_host(a_h), f.from_host(b_h), trans_a=trans_a, trans_b=trans_b
    )
    assert y.shape == (m, n)
    a64, b64 = f64(a_h), f64(b_h)
    expected = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    assert_close(await fetch(y, dtype), expected, dtype, scale=_scale(k))


async def test_an_integer_gemm_computes_in_its_dtype(backend: ComputeBackend) -> None:
    """alpha and beta of an integer GEMM are whole, and the result wraps as the products do,
    on every backend (alpha=0.5 gave zeros on OpenCL and rounded halves on the CPU; the CPU
    computed in float64: INT32_MAX * 2 became INT_MIN, and I64 lost its low bits past 2**53)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.from_host(np.array([[1, 2], [3, -5]], np.int32))
    eye = f.from_host(np.eye(2, dtype=np.int32))
    for kwargs in ({"alpha": 0.5}, {"beta": 0.5, "c": a}, {"alpha": 2.0**40}):
        with pytest.raises(InvalidArgumentError, match=r"alpha|beta"):
            ops.gemm(a, eye, **kwargs)
    big = f.from_host(np.array([[2**31 - 1]], np.int32))
    one = f.from_host(np.array([[1]], np.int32))
    assert (await fetch(ops.gemm(big, one, alpha=2.0), DType.I32)).item() == -2
    # Integer a and b with a float c: a float result, fractional alpha and beta allowed; and
    # narrow a and b with a wider c compute in the result's dtype (I8 products overflowed).
    ones = f.from_host(np.ones((2, 2), np.int32))
    quarter = f.from_host(np.full((2, 2), 0.25, np.float32))
    got = await fetch(ops.gemm(ones, ones, quarter, alpha=0.5, beta=0.5))
    np.testing.assert_array_equal(got, np.full((2, 2), 1.125, np.float32))
    if DType.I8 in backend.capabilities.dtypes:
        i8 = f.from_host(np.full((1, 2), 100, np.int8))
        c32 = f.from_host(np.array([[100000]], np.int32))
        wide = ops.gemm(i8, ops.permute(i8, (1, 0)), c32, beta=1.0)
        assert (await fetch(wide, DType.I32)).item() == 120000
    if DType.I64 in backend.capabilities.dtypes:
        x = f.from_host(np.array([[2**53 + 1]], np.int64))
        one64 = f.from_host(np.array([[1]], np.int64))
        got = await fetch(ops.gemm(x, one64, one64, alpha=3.0, beta=-1.0), DType.I64)
        assert got.item() == 3 * (2**53 + 1) - 1


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize(
    ("c_shape", "alpha", "beta"),
    [
        ((4, 6), 2.0, 1.0),
        ((6,), 1.0, -1.0),
        ((1, 6), 0.5, 2.0),
        ((4, 1), -1.0, 3.0),
        ((), 1.0, 1.0),
    ],
)
async def test_gemm_alpha_beta_and_c(
    backend: ComputeBackend, dtype: DType, c_shape: tuple[int, ...], alpha: float, beta: float
) -> None:
    require_dtype(backend, dtype)
    if not dtype.is_floating:
        alpha = round(alpha) or 3.0  # a fractional alpha has no integer result to compare with
    a_h, b_h, c_h = _inputs(dtype, (4, 5), (5, 6), c_shape, seed=3)
    f = backend.tensor_factory
    c = f.from_host(c_h)
    y = backend.tensor_ops.gemm(f.from_host(a_h), f.from_host(b_h), c, alpha=alpha, beta=beta)
    assert y.shape == (4, 6)
    expected = alpha * (f64(a_h) @ f64(b_h)) + beta * f64(c_h)
    assert_close(await fetch(y, dtype), expected, dtype, scale=2.0)
    # c is an input, never written.
    np.testing.assert_array_equal(await fetch(c, dtype), c_h)


async def test_gemm_beta_zero_ignores_c(backend: ComputeBackend) -> None:
    """As in BLAS, beta == 0 means c is not read: NaN in c does not leak into the result."""
    f = backend.tensor_factory
    a_h, b_h = _inputs(DType.F32, (3, 4), (4, 2))
    c = f.full((3, 2), float("nan"))
    y = backend.tensor_ops.gemm(f.from_host(a_h), f.from_host(b_h), c, alpha=1.5, beta=0.0)
    assert_close(await fetch(y, DType.F32), 1.5 * (f64(a_h) @ f64(b_h)), DType.F32)


@pytest.mark.parametrize(
    ("da", "db", "dc", "dout"),
    [
        (DType.F16, DType.F32, None, DType.F32),
        (DType.F32, DType.F64, None, DType.F64),
        (DType.BF16, DType.BF16, DType.F32, DType.F32),
        (DType.I32, DType.F32, None, DType.F32),
    ],
    ids=lambda d: d.value if isinstance(d, DType) else "none",
)
async def test_gemm_result_dtype(
    backend: ComputeBackend, da: DType, db: DType, dc: DType | None, dout: DType
) -> None:
    require_dtype(backend, da, db, dout)
    f = backend.tensor_factory
    a_h = sample((2, 3), da, low=-2, high=2, seed=1)
    b_h = sample((3, 4), db, low=-2, high=2, seed=2)
    c_h = None if dc is None else sample((2, 4), dc, seed=3)
    c = None if c_h is None else f.from_host(c_h)
    y = backend.tensor_ops.gemm(f.from_host(a_h), f.from_host(b_h), c, beta=1.0)
    expected = f64(a_h) @ f64(b_h) + (0 if c_h is None else f64(c_h))
    assert_close(await fetch(y, dout), expected, dout)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_gemm_large_runs_off_the_loop_and_matches(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    a_h, b_h = _inputs(dtype, (96, 128), (128, 80), seed=9)
    f = backend.tensor_factory
    y = backend.tensor_ops.gemm(f.from_host(a_h), f.from_host(b_h), trans_a=False, alpha=0.5)
    assert_close(await fetch(y, dtype), 0.5 * (f64(a_h) @ f64(b_h)), dtype, scale=_scale(128))


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (True, False), (False, True)])
async def test_batched_gemm(
    backend: ComputeBackend, dtype: DType, trans_a: bool, trans_b: bool
) -> None:
    require_dtype(backend, dtype)
    bsz, m, k, n = 3, 4, 5, 2
    a_h, b_h, c_h = _inputs(
        dtype, (bsz, k, m) if trans_a else (bsz, m, k), (bsz, n, k) if trans_b else (bsz, k, n),
        (bsz, m, n), seed=5,
    )  # fmt: skip
    f = backend.tensor_factory
    y = backend.tensor_ops.batched_gemm(
        f.from_host(a_h), f.from_host(b_h), f.from_host(c_h), trans_a=trans_a, trans_b=trans_b,
        alpha=2.0, beta=1.0,
    )  # fmt: skip
    assert y.shape == (bsz, m, n)
    expected = np.zeros((bsz, m, n))
    for i in range(bsz):
        a = f64(a_h[i]).T if trans_a else f64(a_h[i])
        b = f64(b_h[i]).T if trans_b else f64(b_h[i])
        expected[i] = 2.0 * (a @ b) + f64(c_h[i])
    assert_close(await fetch(y, dtype), expected, dtype, scale=2.0)


@pytest.mark.parametrize(
    ("sa", "sb", "sout"),
    [
        ((3, 4), (4, 5), (3, 5)),
        ((4,), (4, 5), (5,)),
        ((3, 4), (4,), (3,)),
        ((4,), (4,), ()),
        ((2, 3, 4), (4, 5), (2, 3, 5)),
        ((4,), (2, 4, 5), (2, 5)),
        ((2, 1, 3, 4), (5, 4, 2), (2, 5, 3, 2)),
        ((1, 3, 4), (6, 4, 2), (6, 3, 2)),
    ],
)
@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
async def test_matmul(
    backend: ComputeBackend,
    dtype: DType,
    sa: tuple[int, ...],
    sb: tuple[int, ...],
    sout: tuple[int, ...],
) -> None:
    require_dtype(backend, dtype)
    a_h, b_h = _inputs(dtype, sa, sb, seed=7)
    f = backend.tensor_factory
    a, b = f.from_host(a_h), f.from_host(b_h)
    y = backend.tensor_ops.matmul(a, b)
    assert y.shape == sout
    expected = np.matmul(f64(a_h), f64(b_h))  # float64 matmul of the exact inputs
    assert_close(await fetch(y, dtype), expected, dtype)
    assert_close(await fetch(a @ b, dtype), expected, dtype)


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((2, 1, 0), (0, 4)), ((2, 3, 4), (4, 0)), ((0, 3, 4), (4, 5)), ((3, 0), (0, 2)),
     ((2, 3, 0), (2, 0, 5))],
    ids=["k0-batched", "n0-batched", "batch0", "k0", "k0-both-batched"],
)  # fmt: skip
async def test_matmul_and_linear_with_an_empty_dimension(
    backend: ComputeBackend, sa: tuple[int, ...], sb: tuple[int, ...]
) -> None:
    """An empty inner dimension sums nothing: zeros of the full shape (the CPU's batched
    [..., m, 0] @ [0, n] raised a NumPy ValueError from its one-GEMM reshape)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    a_h, b_h = np.ones(sa, np.float32), np.ones(sb, np.float32)
    expected = np.matmul(a_h, b_h)
    np.testing.assert_array_equal(
        await fetch(ops.matmul(f.from_host(a_h), f.from_host(b_h))), expected
    )
    if len(sb) == 2:
        w = f.from_host(np.ascontiguousarray(b_h.T))
        np.testing.assert_array_equal(await fetch(ops.linear(f.from_host(a_h), w)), expected)


async def test_matmul_explicit_loops(backend: ComputeBackend) -> None:
    """A batched, broadcasting product against a triple loop (independent of np.matmul)."""
    a_h, b_h = _inputs(DType.F64, (2, 1, 3, 4), (3, 4, 2), seed=1)
    y = backend.tensor_ops.matmul(
        backend.tensor_factory.from_host(a_h), backend.tensor_factory.from_host(b_h)
    )
    expected = np.zeros((2, 3, 3, 2))
    for i in range(2):
        for j in range(3):
            for r in range(3):
                for c in range(2):
                    expected[i, j, r, c] = sum(a_h[i, 0, r, t] * b_h[j, t, c] for t in range(4))
    assert_close(await fetch(y, DType.F64), expected, DType.F64)


async def test_matmul_mixed_dtypes_promote(backend: ComputeBackend) -> None:
    require_dtype(backend, DType.F16, DType.BF16)
    f = backend.tensor_factory
    a = f.from_host(np.ones((2, 3), np.float16))
    b = f.from_host(np.ones((3, 2), np.float32))
    assert backend.tensor_ops.matmul(a, b).dtype is DType.F32
    c = f.from_host(np.ones((3, 2), np.dtype("bfloat16")))
    y = backend.tensor_ops.matmul(a, c)
    assert_close(await fetch(y, DType.F32), np.full((2, 2), 3.0), DType.F32)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_matmul_low_precision_accumulates_in_f32(
    backend: ComputeBackend, dtype: DType
) -> None:
    """1 + 2048 * 2**-11: an f16/bf16 accumulator would stall at 1 + a few ulps."""
    require_dtype(backend, dtype)
    k = 2048
    a_h = np.full((1, k), 2.0**-6, dtype.to_numpy())
    b_h = np.full((k, 1), 2.0**-5, dtype.to_numpy())
    f = backend.tensor_factory
    y = backend.tensor_ops.matmul(f.from_host(a_h), f.from_host(b_h))
    assert_close(await fetch(y, dtype), np.full((1, 1), 1.0), dtype)


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape", [(5, 6), (2, 3, 6), (6,)])
async def test_linear(
    backend: ComputeBackend, dtype: DType, with_bias: bool, x_shape: tuple[int, ...]
) -> None:
    require_dtype(backend, dtype)
    x_h, w_h, b_h = _inputs(dtype, x_shape, (4, 6), (4,), seed=2)
    f = backend.tensor_factory
    bias = f.from_host(b_h) if with_bias else None
    y = backend.tensor_ops.linear(f.from_host(x_h), f.from_host(w_h), bias)
    assert y.shape == (*x_shape[:-1], 4)
    expected = np.einsum("...i,oi->...o", f64(x_h), f64(w_h))
    if with_bias:
        expected = expected + f64(b_h)
    assert_close(await fetch(y, dtype), expected, dtype)
