"""Elementwise ops: unary, binary, where, cast, with the dtype rules of
``accelkit.ops._mixins.elementwise`` (promotion, weak Python scalars, true division)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType, Tensor, TensorOps

from . import reference as ref
from .checks import (
    ALL_DTYPES,
    FLOATS,
    INTS,
    SIGNED,
    UNSIGNED,
    assert_close,
    f64,
    fetch,
    ids,
    require_dtype,
    sample,
)

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

FLOAT_UNARY = list(ref.UNARY)
# Input ranges that keep each op away from poles and undefined regions.
_DOMAIN = {"log": (0.05, 4.0), "sqrt": (0.0, 4.0), "rsqrt": (0.05, 4.0), "tan": (-1.2, 1.2)}
_SHAPES = {"small": (3, 5), "large": (256, 160)}  # large: past any inline/small-work threshold


def _unary_call(ops: TensorOps, op: str, x: Tensor) -> Any:
    if op == "gelu_tanh":
        return ops.gelu(x, approximate="tanh")
    return getattr(ops, op)(x)


@pytest.mark.parametrize("size", list(_SHAPES))
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("op", FLOAT_UNARY)
async def test_unary_float(backend: ComputeBackend, op: str, dtype: DType, size: str) -> None:
    require_dtype(backend, dtype)
    lo, hi = _DOMAIN.get(op, (-3.0, 3.0))
    x_h = sample(_SHAPES[size], dtype, low=lo, high=hi, seed=len(op))
    x = backend.tensor_factory.from_host(x_h)
    expected = ref.UNARY[op](f64(x_h))
    # The generic entry point and the named shortcut agree.
    y1 = backend.tensor_ops.unary(op, x)
    y2 = _unary_call(backend.tensor_ops, op, x)
    assert_close(await fetch(y1, dtype), expected, dtype)
    assert_close(await fetch(y2, dtype), expected, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_round_is_half_to_even_and_floor_ceil_are_exact(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    ops = backend.tensor_ops
    x_h = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1.25, -1.75], dtype.to_numpy())
    x = backend.tensor_factory.from_host(x_h)
    np.testing.assert_array_equal(
        f64(await fetch(ops.round(x), dtype)), [0, 2, 2, -0, -2, -2, 1, -2]
    )
    np.testing.assert_array_equal(f64(await fetch(ops.floor(x), dtype)), np.floor(f64(x_h)))
    np.testing.assert_array_equal(f64(await fetch(ops.ceil(x), dtype)), np.ceil(f64(x_h)))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_unary_special_values(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    ops = backend.tensor_ops
    x = backend.tensor_factory.from_host(np.array([0.0, -1.0, np.inf], dtype.to_numpy()))
    log = f64(await fetch(ops.log(x), dtype))
    assert log[0] == -np.inf
    assert np.isnan(log[1])
    assert log[2] == np.inf
    sig = f64(await fetch(ops.sigmoid(ops.neg(x)), dtype))
    np.testing.assert_allclose(sig, [0.5, 1 / (1 + np.exp(-1.0)), 0.0], rtol=1e-2)
    assert f64(await fetch(ops.exp(x), dtype))[2] == np.inf


@pytest.mark.parametrize("dtype", [*INTS, DType.BOOL], ids=ids([*INTS, DType.BOOL]))
@pytest.mark.parametrize("op", ["sigmoid", "exp", "sqrt", "sin", "tanh", "gelu", "silu", "erf"])
async def test_unary_transcendental_on_integers_gives_f32(
    backend: ComputeBackend, op: str, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    x_h = sample((4, 3), dtype, low=0, high=6, seed=2)
    y = backend.tensor_ops.unary(op, backend.tensor_factory.from_host(x_h))
    assert_close(await fetch(y, DType.F32), ref.UNARY[op](f64(x_h)), DType.F32)


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
@pytest.mark.parametrize("op", ["relu", "abs", "neg", "floor", "ceil", "round"])
async def test_unary_same_dtype_on_integers(backend: ComputeBackend, op: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    x_h = sample((5, 4), dtype, low=-100, high=100, seed=5)
    y = backend.tensor_ops.unary(op, backend.tensor_factory.from_host(x_h))
    got = await fetch(y, dtype)
    if op == "relu":
        expected = np.where(x_h > 0, x_h, 0).astype(x_h.dtype)
    elif op == "abs":
        expected = np.abs(x_h)
    elif op == "neg":
        expected = np.negative(x_h)  # unsigned negation wraps modulo 2**bits
    else:
        expected = x_h
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("op", ["relu", "abs"])
async def test_unary_same_dtype_on_bool(backend: ComputeBackend, op: str) -> None:
    x_h = np.array([True, False, True])
    y = backend.tensor_ops.unary(op, backend.tensor_factory.from_host(x_h))
    np.testing.assert_array_equal(await fetch(y, DType.BOOL), x_h)


# -- binary -----------------------------------------------------------------------------------------
ARITH = ["add", "sub", "mul", "maximum", "minimum", "pow", "mod", "div"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _binary_inputs(
    op: str, dtype: DType, shape_a: tuple[int, ...], shape_b: tuple[int, ...]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    if dtype is DType.BOOL:
        return sample(shape_a, dtype, seed=1), sample(shape_b, dtype, seed=2)
    if dtype.is_floating:
        if op == "pow":
            return (
                sample(shape_a, dtype, low=0.5, high=2.0, seed=1),
                sample(shape_b, dtype, low=-2.0, high=2.0, seed=2),
            )
        a = sample(shape_a, dtype, low=-4, high=4, seed=1)
        b = sample(shape_b, dtype, low=0.5, high=3, seed=2)
        if op in ("div", "mod"):
            b = np.where(np.arange(b.size).reshape(b.shape) % 2 == 0, b, -b).astype(b.dtype)
        return a, b
    lo = 5 if dtype in UNSIGNED else -6  # unsigned a >= b, so that a - b does not wrap
    if op == "pow":
        a = sample(shape_a, dtype, low=0 if dtype in UNSIGNED else -3, high=3, seed=1)
        return a, sample(shape_b, dtype, low=0, high=3, seed=2)
    a = sample(shape_a, dtype, low=lo, high=9, seed=1)
    b = sample(shape_b, dtype, low=1, high=5, seed=2)
    if op in ("div", "mod") and dtype in SIGNED:
        b = np.where(np.arange(b.size).reshape(b.shape) % 2 == 0, b, -b).astype(b.dtype)
    return a, b


def _expected_dtype(op: str, dtype: DType) -> DType:
    if op in COMPARE:
        return DType.BOOL
    if op == "div" and not dtype.is_floating:
        return DType.F32
    return dtype


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (op, dt)
        for op in ARITH + COMPARE
        for dt in ALL_DTYPES
        if not (dt is DType.BOOL and op in ("sub", "pow", "mod"))  # refused: see test_bad_input
    ],
    ids=lambda v: v.value if isinstance(v, DType) else v,
)
async def test_binary_same_dtype(backend: ComputeBackend, op: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    a_h, b_h = _binary_inputs(op, dtype, (4, 6), (4, 6))
    f, ops = backend.tensor_factory, backend.tensor_ops
    a, b = f.from_host(a_h), f.from_host(b_h)
    out_dt = _expected_dtype(op, dtype)
    with np.errstate(all="ignore"):
        expected = ref.BINARY[op](f64(a_h), f64(b_h))
    if out_dt is DType.BOOL and op not in COMPARE:
        expected = expected != 0
    for y in (ops.binary(op, a, b), getattr(ops, op)(a, b)):
        assert_close(await fetch(y, out_dt), expected, out_dt)


@pytest.mark.parametrize(
    ("shape_a", "shape_b", "shape_out"),
    [
        ((3, 1, 4), (5, 1), (3, 5, 4)),
        ((), (2, 3), (2, 3)),
        ((2, 3), (3,), (2, 3)),
        ((4, 1), (1, 4), (4, 4)),
        ((0, 3), (1, 3), (0, 3)),
    ],
)
@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "maximum", "lt"])
async def test_binary_broadcasting(
    backend: ComputeBackend,
    op: str,
    shape_a: tuple[int, ...],
    shape_b: tuple[int, ...],
    shape_out: tuple[int, ...],
) -> None:
    a_h, b_h = _binary_inputs(op, DType.F32, shape_a, shape_b)
    f = backend.tensor_factory
    y = backend.tensor_ops.binary(op, f.from_host(a_h), f.from_host(b_h))
    assert y.shape == shape_out
    out_dt = _expected_dtype(op, DType.F32)
    assert_close(await fetch(y, out_dt), ref.BINARY[op](f64(a_h), f64(b_h)), out_dt)
    y2 = backend.tensor_ops.binary(op, f.from_host(b_h), f.from_host(a_h))
    assert y2.shape == shape_out
    assert_close(await fetch(y2, out_dt), ref.BINARY[op](f64(b_h), f64(a_h)), out_dt)


@pytest.mark.parametrize(
    ("da", "db", "dout"),
    [
        (DType.F32, DType.F64, DType.F64),
        (DType.F16, DType.F32, DType.F32),
        (DType.BF16, DType.F16, DType.F32),
        (DType.BF16, DType.F64, DType.F64),
        (DType.BF16, DType.I32, DType.BF16),
        (DType.I32, DType.F16, DType.F16),
        (DType.U8, DType.F64, DType.F64),
        (DType.I8, DType.U8, DType.I16),
        (DType.U8, DType.U16, DType.U16),
        (DType.I32, DType.I64, DType.I64),
        (DType.U32, DType.I32, DType.I64),
        (DType.U64, DType.I64, DType.I64),
        (DType.U64, DType.I8, DType.I64),
        (DType.BOOL, DType.I8, DType.I8),
        (DType.BOOL, DType.F32, DType.F32),
        (DType.I64, DType.F32, DType.F32),
    ],
    ids=lambda d: d.value,
)
async def test_binary_promotion(backend: ComputeBackend, da: DType, db: DType, dout: DType) -> None:
    require_dtype(backend, da, db, dout)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a_h = sample((3, 4), da, low=0, high=5, seed=1)
    b_h = sample((3, 4), db, low=0, high=5, seed=2)
    a, b = f.from_host(a_h), f.from_host(b_h)
    for y in (ops.add(a, b), ops.add(b, a), ops.mul(a, b), ops.maximum(b, a)):
        assert y.dtype is dout
    assert_close(await fetch(ops.add(a, b), dout), f64(a_h) + f64(b_h), dout)
    assert_close(await fetch(ops.mul(b, a), dout), f64(a_h) * f64(b_h), dout)
    assert_close(await fetch(ops.lt(a, b), DType.BOOL), f64(a_h) < f64(b_h), DType.BOOL)
    div_dt = dout if dout.is_floating else DType.F32
    b_nz = f.from_host(np.maximum(b_h, 1).astype(b_h.dtype))
    expected = f64(a_h) / np.maximum(f64(b_h), 1)
    assert_close(await fetch(ops.div(a, b_nz), div_dt), expected, div_dt)


@pytest.mark.parametrize(
    ("dtype", "scalar", "dout"),
    [
        (DType.I32, 2, DType.I32),
        (DType.I32, 2.5, DType.F32),
        (DType.U8, 3, DType.U8),
        (DType.I8, -3, DType.I8),
        (DType.BOOL, 1, DType.I64),
        (DType.BOOL, True, DType.BOOL),
        (DType.BOOL, 0.5, DType.F32),
        (DType.F16, 1.5, DType.F16),
        (DType.F16, 3, DType.F16),
        (DType.BF16, 2, DType.BF16),
        (DType.F64, 0.25, DType.F64),
        (DType.I64, True, DType.I64),
        (DType.U64, 7, DType.U64),
    ],
    ids=lambda v: v.value if isinstance(v, DType) else repr(v),
)
@pytest.mark.parametrize("op", ["add", "mul", "maximum"])
async def test_binary_with_python_scalars(
    backend: ComputeBackend, op: str, dtype: DType, scalar: bool | float, dout: DType
) -> None:
    require_dtype(backend, dtype, dout)
    x_h = sample((2, 5), dtype, low=0, high=9, seed=4)
    x = backend.tensor_factory.from_host(x_h)
    fn = ref.BINARY[op]
    left = backend.tensor_ops.binary(op, x, scalar)
    right = backend.tensor_ops.binary(op, scalar, x)
    for y, expected in ((left, fn(f64(x_h), float(scalar))), (right, fn(float(scalar), f64(x_h)))):
        if dout is DType.BOOL:
            expected = expected != 0
        assert_close(await fetch(y, dout), expected, dout)


@pytest.mark.parametrize("dtype", [DType.U8, DType.I32, DType.F32, DType.BF16], ids=str)
async def test_scalar_on_the_left_of_non_commutative_ops(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    ops = backend.tensor_ops
    x_h = np.array([1, 2, 3, 5], dtype.to_numpy())
    x = backend.tensor_factory.from_host(x_h)
    assert_close(await fetch(ops.sub(10, x), dtype), 10 - f64(x_h), dtype)
    div_dt = dtype if dtype.is_floating else DType.F32
    assert_close(await fetch(ops.div(1, x), div_dt), 1 / f64(x_h), div_dt)
    assert_close(await fetch(ops.pow(2, x), dtype), 2 ** f64(x_h), dtype)
    assert_close(await fetch(ops.mod(11, x), dtype), 11 % f64(x_h), dtype)
    assert_close(await fetch(ops.gt(3, x), DType.BOOL), f64(x_h) < 3, DType.BOOL)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64, DType.I32, DType.I64], ids=str)
async def test_mod_takes_the_sign_of_the_divisor(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    ops = backend.tensor_ops
    a_h = np.array([7, -7, 7, -7, 0], dtype.to_numpy())
    b_h = np.array([3, 3, -3, -3, 5], dtype.to_numpy())
    f = backend.tensor_factory
    got = await fetch(ops.mod(f.from_host(a_h), f.from_host(b_h)), dtype)
    np.testing.assert_array_equal(f64(got), [1, 2, -2, -1, 0])
    if dtype.is_floating:
        got = await fetch(
            ops.mod(f.from_host(np.array([-7.5, 7.5], dtype.to_numpy())), -2.0), dtype
        )
        np.testing.assert_allclose(f64(got), [-1.5, -0.5])
        # a zero remainder has the divisor's sign too (NumPy's npy_divmod): OpenCL gave +0.0
        a0 = f.from_host(np.array([0.0, -0.0, 6.0, -6.0, 0.0, -6.0], dtype.to_numpy()))
        b0 = f.from_host(np.array([-1.0, -1.0, -3.0, -3.0, 1.0, 3.0], dtype.to_numpy()))
        got = f64(await fetch(ops.mod(a0, b0), dtype))
        np.testing.assert_array_equal(got, 0.0)
        np.testing.assert_array_equal(np.signbit(got), [True, True, True, True, False, False])


@pytest.mark.parametrize("dtype", SIGNED, ids=ids(SIGNED))
async def test_integer_pow_with_negative_exponents_truncates(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    a = f.from_host(np.array([2, -1, 1, -1, 3, -2], dtype.to_numpy()))
    b = f.from_host(np.array([-1, -3, -5, -2, 2, 3], dtype.to_numpy()))
    got = await fetch(backend.tensor_ops.pow(a, b), dtype)
    np.testing.assert_array_equal(got, [0, -1, 1, 1, 9, -8])


@pytest.mark.parametrize("dtype", [DType.I32, DType.U8, DType.BOOL], ids=str)
async def test_integer_true_division_gives_f32(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.from_host(np.array([1, 3, 0], dtype.to_numpy()))
    b = f.from_host(np.array([2, 0, 0], dtype.to_numpy()))
    got = await fetch(ops.div(a, b), DType.F32)
    if dtype is DType.BOOL:
        np.testing.assert_array_equal(got[:2], [1.0, np.inf])  # True/True, True/False
    else:
        np.testing.assert_array_equal(got[:2], [0.5, np.inf])
    assert np.isnan(got[2])


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_float_division_by_zero_is_ieee(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    f = backend.tensor_factory
    a = f.from_host(np.array([1.0, -1.0, 0.0], dtype.to_numpy()))
    got = f64(await fetch(backend.tensor_ops.div(a, 0.0), dtype))
    assert got[0] == np.inf
    assert got[1] == -np.inf
    assert np.isnan(got[2])


@pytest.mark.parametrize("dtype", [DType.U8, DType.I8, DType.I32], ids=str)
async def test_compare_with_out_of_range_python_int(backend: ComputeBackend, dtype: DType) -> None:
    require_dtype(backend, dtype)
    x = backend.tensor_factory.from_host(np.array([0, 5, 100], dtype.to_numpy()))
    ops = backend.tensor_ops
    np.testing.assert_array_equal(await fetch(ops.lt(x, 1000), DType.BOOL), [True] * 3)
    np.testing.assert_array_equal(await fetch(ops.eq(x, -1000), DType.BOOL), [False] * 3)


async def test_comparisons_of_bf16_and_f16_with_scalars(backend: ComputeBackend) -> None:
    require_dtype(backend, DType.BF16, DType.F16)
    f, ops = backend.tensor_factory, backend.tensor_ops
    for dt in (DType.BF16, DType.F16):
        x = f.from_host(np.array([0.5, 1.0, 2.0], dt.to_numpy()))
        np.testing.assert_array_equal(await fetch(ops.ge(x, 1.0), DType.BOOL), [False, True, True])
        np.testing.assert_array_equal(await fetch(ops.ne(x, 1), DType.BOOL), [True, False, True])


# -- where and cast ---------------------------------------------------------------------------------
async def test_where_tensors_with_broadcasting(backend: ComputeBackend) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    cond_h = np.array([[True], [False], [True]])
    a_h = np.arange(4, dtype=np.float32)
    b_h = np.full((3, 4), -1.0, np.float32)
    y = ops.where(f.from_host(cond_h), f.from_host(a_h), f.from_host(b_h))
    assert y.shape == (3, 4)
    assert_close(await fetch(y, DType.F32), np.where(cond_h, a_h, b_h), DType.F32)


@pytest.mark.parametrize(
    ("a", "b", "dout", "expected"),
    [
        ("x_f16", 1, DType.F16, [1.0, 1.0, 3.0]),
        (0.5, "x_f16", DType.F16, [0.5, 2.0, 0.5]),
        ("x_i32", 2.5, DType.F32, [1.0, 2.5, 3.0]),
        ("x_i32", -1, DType.I32, [1, -1, 3]),
        ("x_i32", "x_f16", DType.F16, [1.0, 2.0, 3.0]),
        ("x_u8", "x_i32", DType.I32, [7, 2, 7]),
        ("x_bool", "x_i32", DType.I32, [1, 2, 0]),
    ],
)
async def test_where_dtypes_and_scalars(
    backend: ComputeBackend,
    a: Any,  # a scalar, or the name of a tensor below
    b: Any,
    dout: DType,
    expected: list[float],
) -> None:
    if "x_f16" in (a, b):
        require_dtype(backend, DType.F16)
    f = backend.tensor_factory
    tensors = {
        "x_i32": f.from_host(np.array([1, 2, 3], np.int32)),
        "x_u8": f.from_host(np.array([7, 7, 7], np.uint8)),
        "x_bool": f.from_host(np.array([True, True, False])),
    }
    if "x_f16" in (a, b):
        tensors["x_f16"] = f.from_host(np.array([1, 2, 3], np.float16))
    cond = f.from_host(np.array([True, False, True]))
    y = backend.tensor_ops.where(cond, tensors.get(a, a), tensors.get(b, b))
    assert_close(await fetch(y, dout), np.array(expected), dout)


@pytest.mark.parametrize("dst", ALL_DTYPES, ids=ids(ALL_DTYPES))
@pytest.mark.parametrize("src", ALL_DTYPES, ids=ids(ALL_DTYPES))
async def test_cast_exact_values(backend: ComputeBackend, src: DType, dst: DType) -> None:
    """Values every dtype holds exactly survive every cast; to BOOL is ``x != 0``."""
    require_dtype(backend, src, dst)
    values = [0, 1, 0, 1] if src is DType.BOOL else [0, 1, 2, 100]
    if src in SIGNED or src.is_floating:
        values = [0, 1, 2, 100] if dst in UNSIGNED or dst is DType.BOOL else [0, -1, 2, 100]
    x_h = np.array(values).astype(src.to_numpy())
    y = backend.tensor_ops.cast(backend.tensor_factory.from_host(x_h), dst)
    got = await fetch(y, dst)
    expected = np.array(values) != 0 if dst is DType.BOOL else np.array(values)
    np.testing.assert_array_equal(f64(got), f64(expected))


@pytest.mark.parametrize("src", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("dst", [DType.I8, DType.I32, DType.I64, DType.U8, DType.U16], ids=str)
async def test_cast_float_to_int_truncates_and_zeroes_the_unrepresentable(
    backend: ComputeBackend, src: DType, dst: DType
) -> None:
    require_dtype(backend, src, dst)
    info = np.iinfo(dst.to_numpy())
    hi = 126.9 if info.max >= 127 else 0.0
    values = np.array([1.75, -1.75, 0.5, -0.5, hi, np.nan, np.inf, -np.inf, 1e20, -1e20])
    with np.errstate(over="ignore"):
        x_h = values.astype(src.to_numpy())
    got = await fetch(backend.tensor_ops.cast(backend.tensor_factory.from_host(x_h), dst), dst)
    xs = f64(x_h)
    expected = []
    for v in xs:
        t = np.trunc(v) if np.isfinite(v) else None
        expected.append(int(t) if t is not None and info.min <= t <= info.max else 0)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("src", FLOATS, ids=ids(FLOATS))
async def test_cast_float_to_u8_keeps_in_range_truncations(
    backend: ComputeBackend, src: DType
) -> None:
    """255.5 truncates to 255, which fits; -0.5 truncates to 0, which fits."""
    require_dtype(backend, src)
    x_h = np.array([255.5, -0.5, 254.0, 256.0], src.to_numpy())
    got = await fetch(
        backend.tensor_ops.cast(backend.tensor_factory.from_host(x_h), DType.U8), DType.U8
    )
    expected = [int(np.trunc(v)) if 0 <= np.trunc(v) <= 255 else 0 for v in f64(x_h)]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("src", FLOATS, ids=ids(FLOATS))
async def test_cast_float_to_bool(backend: ComputeBackend, src: DType) -> None:
    require_dtype(backend, src)
    x_h = np.array([0.0, -0.0, 0.1, -2.0, np.inf], src.to_numpy())
    got = await fetch(
        backend.tensor_ops.cast(backend.tensor_factory.from_host(x_h), "bool"), DType.BOOL
    )
    np.testing.assert_array_equal(got, [False, False, True, True, True])


@pytest.mark.parametrize("dst", [DType.F16, DType.BF16, DType.F32], ids=str)
async def test_cast_rounds_to_nearest_float(backend: ComputeBackend, dst: DType) -> None:
    require_dtype(backend, dst, DType.F64)  # the source is f64
    x_h = np.array([1 / 3, 1000.7, -(2.0**-3), 257.0], np.float64)
    got = await fetch(backend.tensor_ops.cast(backend.tensor_factory.from_host(x_h), dst), dst)
    np.testing.assert_array_equal(got, x_h.astype(dst.to_numpy()))
