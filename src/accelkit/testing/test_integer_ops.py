"""Integer arithmetic: floor_divide and fmod that stay in the integer dtype, bitwise ops and
shifts, at their edges (division by 0 and -1, INT_MIN, shift counts outside 0..bits-1), against
Python's own integer arithmetic (an independent reference) and NumPy's float ufuncs."""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import InvalidArgumentError

from .checks import FLOATS, INTS, assert_close, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

INT_DTYPES = INTS
FLOAT_DTYPES = FLOATS


def _wrap(v: int, dtype: DType) -> int:
    """``v`` wrapped into ``dtype``'s range (two's complement)."""
    bits = 8 * dtype.itemsize
    v &= (1 << bits) - 1
    if dtype.is_signed and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _python(op: str, a: int, b: int, dtype: DType) -> int:
    """The documented result of ``a op b`` in ``dtype``, from Python integers."""
    bits = 8 * dtype.itemsize
    if op == "floor_divide":
        return 0 if b == 0 else _wrap(a // b, dtype)
    if op == "fmod":
        r = abs(a) % abs(b) if b else 0
        return _wrap(-r if a < 0 else r, dtype)
    if op == "bitwise_and":
        return _wrap(a & b, dtype)
    if op == "bitwise_or":
        return _wrap(a | b, dtype)
    if op == "bitwise_xor":
        return _wrap(a ^ b, dtype)
    if op == "left_shift":
        return 0 if not 0 <= b < bits else _wrap(a << b, dtype)
    if op == "right_shift":
        return (-1 if a < 0 else 0) if not 0 <= b < bits else a >> b
    raise AssertionError(op)


def _edges(dtype: DType, shift: bool) -> tuple[list[int], list[int]]:
    info = np.iinfo(dtype.to_numpy())
    lo, hi = int(info.min), int(info.max)
    bits = 8 * dtype.itemsize
    a = [lo, hi, 0, 1, 7, 100 % (hi + 1)] + ([-1, -7, lo + 1] if lo < 0 else [hi - 1])
    if shift:
        b = [0, 1, 3, bits - 1, bits, bits + 5] + ([-1, -bits] if lo < 0 else [hi])
    else:
        b = [0, 1, 2, 3, hi, 7] + ([-1, -2, lo] if lo < 0 else [hi - 1])
    return a, b


INT_OPS = ["floor_divide", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor"]
SHIFTS = ["left_shift", "right_shift"]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=ids(INT_DTYPES))
@pytest.mark.parametrize("op", INT_OPS + SHIFTS)
async def test_integer_ops_at_their_edges(backend: ComputeBackend, op: str, dtype: DType) -> None:
    require_op(backend, op)
    require_dtype(backend, dtype)
    avals, bvals = _edges(dtype, op in SHIFTS)
    a = np.array([x for x in avals for _ in bvals], dtype.to_numpy())
    b = np.array([y for _ in avals for y in bvals], dtype.to_numpy())
    f = backend.tensor_factory
    got = await fetch(getattr(backend.tensor_ops, op)(f.from_host(a), f.from_host(b)), dtype)
    want = [_python(op, int(x), int(y), dtype) for x, y in zip(a, b, strict=True)]
    np.testing.assert_array_equal(got, np.array(want, dtype.to_numpy()), err_msg=op)


async def test_floor_divide_stays_exact_in_int64(backend: ComputeBackend) -> None:
    """The motivating case: ``(2**40 + 1) // 1`` and friends, which true division in F32
    rounds."""
    require_op(backend, "floor_divide")
    require_dtype(backend, DType.I64)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = np.array([2**40 + 1, 2**53 + 1, -(2**62) - 3, 9], np.int64)
    got = await fetch(ops.floor_divide(f.from_host(a), 3), DType.I64)
    np.testing.assert_array_equal(got, [int(v) // 3 for v in a])
    got = await fetch(ops.floor_divide(f.from_host(a), f.from_host(np.array([1], np.int64))))
    np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids(FLOAT_DTYPES))
@pytest.mark.parametrize("op", ["floor_divide", "fmod"])
async def test_float_floor_divide_and_fmod(backend: ComputeBackend, op: str, dtype: DType) -> None:
    """NumPy's float semantics: ``1 // 0.1 == 9``, ``x // 0`` is ±inf or NaN, ``x fmod 0`` is
    NaN, infinities as IEEE gives them; F16 computed in F32 and rounded once."""
    require_op(backend, op)
    require_dtype(backend, dtype)
    inf, nan = float("inf"), float("nan")
    pairs = [
        (1.0, 0.1), (7.5, 2.0), (-7.5, 2.0), (7.5, -2.0), (-7.5, -2.0), (1.0, 0.0), (-1.0, 0.0),
        (0.0, 0.0), (inf, 2.0), (5.0, inf), (-5.0, inf), (nan, 1.0), (3.0, nan), (0.0, -3.0),
    ]  # fmt: skip
    npd = dtype.to_numpy()
    a = np.array([p[0] for p in pairs]).astype(npd)
    b = np.array([p[1] for p in pairs]).astype(npd)
    f = backend.tensor_factory
    got = await fetch(getattr(backend.tensor_ops, op)(f.from_host(a), f.from_host(b)), dtype)
    compute = np.float32 if dtype is DType.F16 else npd
    with np.errstate(all="ignore"):
        want = getattr(np, op)(a.astype(compute), b.astype(compute)).astype(npd)
    assert_close(got, want, dtype)
    numbers = ~np.isnan(want.astype(np.float64))  # the sign of a NaN means nothing
    np.testing.assert_array_equal(np.signbit(got)[numbers], np.signbit(want)[numbers])


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor"])
async def test_bitwise_on_bool_is_logical(backend: ComputeBackend, op: str) -> None:
    require_op(backend, op, "bitwise_not")
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = np.array([[True, True, False, False]])
    b = np.array([[True], [False]])
    got = await fetch(getattr(ops, op)(f.from_host(a), f.from_host(b)), DType.BOOL)
    np.testing.assert_array_equal(got, getattr(np, op)(a, b))
    got = await fetch(getattr(ops, op)(f.from_host(a), True), DType.BOOL)
    np.testing.assert_array_equal(got, getattr(np, op)(a, True))
    np.testing.assert_array_equal(await fetch(ops.bitwise_not(f.from_host(a))), ~a)


SMALL_INTS = [DType.I8, DType.I64, DType.U16]


@pytest.mark.parametrize("dtype", SMALL_INTS, ids=ids(SMALL_INTS))
async def test_bitwise_not_and_scalar_operands(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "bitwise_not", "bitwise_and", "left_shift", "right_shift")
    require_dtype(backend, dtype)
    x_h = sample((5, 7), dtype, low=-100, high=100, seed=3)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(x_h)
    np.testing.assert_array_equal(await fetch(ops.bitwise_not(x), dtype), ~x_h)
    np.testing.assert_array_equal(await fetch(ops.bitwise_and(x, 0x55), dtype), x_h & 0x55)
    np.testing.assert_array_equal(await fetch(ops.bitwise_xor(3, x), dtype), 3 ^ x_h)
    shifted = [_python("left_shift", int(v), 2, dtype) for v in x_h.reshape(-1)]
    np.testing.assert_array_equal(
        await fetch(ops.left_shift(x, 2), dtype), np.array(shifted, x_h.dtype).reshape(5, 7)
    )
    np.testing.assert_array_equal(await fetch(ops.right_shift(x, 1), dtype), x_h >> 1)


async def test_mixed_integer_dtypes_promote(backend: ComputeBackend) -> None:
    require_op(backend, "floor_divide", "bitwise_or")
    require_dtype(backend, DType.I8, DType.I32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a = f.from_host(np.array([-128, 127, 5], np.int8))
    b = f.from_host(np.array([3, -3, 1000], np.int32))
    q = ops.floor_divide(a, b)
    assert q.dtype is DType.I32
    np.testing.assert_array_equal(await fetch(q), [-128 // 3, 127 // -3, 0])
    np.testing.assert_array_equal(await fetch(ops.bitwise_or(a, b)), [-128 | 3, 127 | -3, 5 | 1000])


#: Each op on Python integers (the independent reference).
_PYTHON_OPS: dict[str, Callable[[int, int], int | bool]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "maximum": max,
    "minimum": min, "bitwise_and": operator.and_, "bitwise_xor": operator.xor,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
}  # fmt: skip
_U64_MIXED = ["add", "sub", "mul", "maximum", "minimum", "bitwise_and", "bitwise_xor", "lt", "eq"]


@pytest.mark.parametrize(
    "signed", [DType.I8, DType.I32, DType.I64], ids=ids([DType.I8, DType.I32, DType.I64])
)
@pytest.mark.parametrize("op", _U64_MIXED)
async def test_u64_with_a_signed_integer_computes_in_i64(
    backend: ComputeBackend, op: str, signed: DType
) -> None:
    """U64 with a signed integer promotes to I64 (not NumPy's F64): both operands wrap into
    I64 and the op runs there, comparisons included (the CPU backend rounded through F64:
    2**60 + 1 lost its 1, 2**64 - 1 became INT64_MIN, and bitwise ops failed)."""
    require_op(backend, op)
    require_dtype(backend, DType.U64, signed, DType.I64)
    top = (1 << 63) - 1 if signed is DType.I64 else int(np.iinfo(signed.to_numpy()).max)
    uvals = [0, 1, 2**60 + 1, 2**63 - 1, 2**63, 2**64 - 1]
    svals = [0, -1, 3, top, -top - 1]
    a = np.array([u for u in uvals for _ in svals], np.uint64)
    b = np.array([v for _ in uvals for v in svals], signed.to_numpy())
    f = backend.tensor_factory
    got = await fetch(getattr(backend.tensor_ops, op)(f.from_host(a), f.from_host(b)))
    wide = [(_wrap(int(x), DType.I64), int(y)) for x, y in zip(a, b, strict=True)]
    compute = _PYTHON_OPS[op]
    if op in ("lt", "eq"):
        want = np.array([compute(x, y) for x, y in wide])
    else:
        want = np.array([_wrap(compute(x, y), DType.I64) for x, y in wide], np.int64)
    np.testing.assert_array_equal(got, want, err_msg=f"{op}(u64, {signed.value})")


_COMPARE = {op: _PYTHON_OPS[op] for op in ("eq", "ne", "lt", "le", "gt", "ge")}


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=ids(INT_DTYPES))
async def test_a_comparison_with_an_int_beyond_the_dtype_compares_its_value(
    backend: ComputeBackend, dtype: DType
) -> None:
    """``x < 2**63`` for an I64 ``x`` is true everywhere, as Python's integers say, on either
    side of the operator (OpenCL compared such numbers in F64, where 2**63 - 1 is 2**63)."""
    info = np.iinfo(dtype.to_numpy())
    lo, hi = int(info.min), int(info.max)
    x_h = np.array([lo, lo + 1, 0, hi - 1, hi], dtype.to_numpy())
    x = backend.tensor_factory.from_host(x_h)
    ops = backend.tensor_ops
    for v in (hi + 1, hi + 2**70, lo - 1, -(2**70), hi, lo):
        for op, compare in _COMPARE.items():
            left = await fetch(getattr(ops, op)(x, v))
            right = await fetch(getattr(ops, op)(v, x))
            np.testing.assert_array_equal(
                left, [compare(int(e), v) for e in x_h], err_msg=f"{dtype.value} {op} {v}"
            )
            np.testing.assert_array_equal(
                right, [compare(v, int(e)) for e in x_h], err_msg=f"{v} {op} {dtype.value}"
            )


@pytest.mark.parametrize(
    ("int_dtype", "value", "float_dtype"),
    [
        (DType.I64, 16777217, DType.F32),
        (DType.I32, 2**31 - 1, DType.F32),
        (DType.I64, 2**53 + 1, DType.F64),
    ],
)
async def test_an_integer_compared_with_a_float_tensor_is_rounded_to_the_float_first(
    backend: ComputeBackend, int_dtype: DType, value: int, float_dtype: DType
) -> None:
    """A tensor comparison runs in the promoted dtype, the float's (as arithmetic does, and as
    PyTorch compares): 16777217 as F32 is 16777216 (the CPU backend compared exactly)."""
    require_dtype(backend, int_dtype, float_dtype)
    f, ops = backend.tensor_factory, backend.tensor_ops
    rounded = float(np.array(value).astype(float_dtype.to_numpy()))
    x = f.from_host(np.array([rounded, rounded + 1e9], float_dtype.to_numpy()))
    i = f.from_host(np.array([value, value], int_dtype.to_numpy()))
    np.testing.assert_array_equal(await fetch(ops.eq(x, i)), [True, False])
    np.testing.assert_array_equal(await fetch(ops.lt(x, i)), [False, False])
    np.testing.assert_array_equal(await fetch(ops.ge(i, x)), [True, False])


@pytest.mark.parametrize(
    ("op", "a_dtype", "b_dtype", "message"),
    [
        ("bitwise_and", DType.F32, DType.I32, "integer or bool"),
        ("bitwise_or", DType.F64, DType.F64, "integer or bool"),
        ("left_shift", DType.I32, DType.F32, "integer operands"),
        ("right_shift", DType.BOOL, DType.BOOL, "not defined for bool"),
        ("floor_divide", DType.BOOL, DType.BOOL, "not defined for bool"),
        ("fmod", DType.BOOL, DType.BOOL, "not defined for bool"),
    ],
)
async def test_integer_ops_refuse_what_they_cannot_hold(
    backend: ComputeBackend, op: str, a_dtype: DType, b_dtype: DType, message: str
) -> None:
    require_op(backend, op)
    require_dtype(backend, a_dtype, b_dtype)
    f, ops = backend.tensor_factory, backend.tensor_ops
    a, b = f.ones((3,), a_dtype), f.ones((3,), b_dtype)
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(InvalidArgumentError, match=message):
        getattr(ops, op)(a, b)
    assert backend.memory_manager.memory_info().used == used


async def test_bitwise_not_refuses_floats(backend: ComputeBackend) -> None:
    require_op(backend, "bitwise_not")
    with pytest.raises(InvalidArgumentError, match="integer or bool"):
        backend.tensor_ops.bitwise_not(backend.tensor_factory.ones((2,)))
