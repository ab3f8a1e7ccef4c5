"""Reductions: sum mean max min prod argmax argmin, over axes, with keepdims, and their dtypes
(sum/prod of integers give I64 or U64, mean of integers F32, arg* I64 with the first extreme)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import InvalidArgumentError

from .checks import FLOATS, UNSIGNED, assert_close, f64, fetch, ids, require_dtype, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

DTYPES = [*FLOATS, DType.I8, DType.I32, DType.I64, DType.U8, DType.U32, DType.BOOL]
AXES = [None, 0, 1, -1, (0, 2), (0, 1, 2), ()]


def _out_dtype(op: str, dtype: DType) -> DType:
    if op in ("argmax", "argmin"):
        return DType.I64
    if op in ("sum", "prod") and not dtype.is_floating:
        return DType.U64 if dtype in UNSIGNED else DType.I64
    if op == "mean" and not dtype.is_floating:
        return DType.F32
    return dtype


def _reference(
    op: str, x: np.ndarray[Any, Any], axis: int | tuple[int, ...] | None, keepdims: bool
) -> Any:  # an array, or a NumPy scalar
    ax = tuple(range(x.ndim)) if axis is None else axis
    fn: Any = {
        "sum": np.sum,
        "mean": np.mean,
        "max": np.max,
        "min": np.min,
        "prod": np.prod,
    }[op]
    return fn(f64(x), axis=ax, keepdims=keepdims)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod"])
async def test_reduce(
    backend: ComputeBackend,
    op: str,
    dtype: DType,
    axis: int | tuple[int, ...] | None,
    keepdims: bool,
) -> None:
    require_dtype(backend, dtype)
    lo, hi = (0.5, 1.5) if op == "prod" else (-3, 3)
    if op == "prod" and not dtype.is_floating:
        lo, hi = 1, 2
    x_h = sample((3, 4, 2), dtype, low=lo, high=hi, seed=1)
    x = backend.tensor_factory.from_host(x_h)
    out_dt = _out_dtype(op, dtype)
    expected = _reference(op, x_h, axis, keepdims)
    for y in (
        backend.tensor_ops.reduce(op, x, axis, keepdims),
        getattr(backend.tensor_ops, op)(x, axis=axis, keepdims=keepdims),
    ):
        assert y.shape == np.shape(expected)
        assert_close(await fetch(y, out_dt), expected, out_dt, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
async def test_arg_reductions(
    backend: ComputeBackend, op: str, dtype: DType, axis: int | None, keepdims: bool
) -> None:
    require_dtype(backend, dtype)
    x_h = sample((4, 5), dtype, low=-50, high=50, seed=8)
    x = backend.tensor_factory.from_host(x_h)
    y = getattr(backend.tensor_ops, op)(x, axis=axis, keepdims=keepdims)
    got = await fetch(y, DType.I64)
    x64 = f64(x_h)
    if axis is None:
        flat = x64.reshape(-1)
        extreme = flat.max() if op == "argmax" else flat.min()
        first = int(np.flatnonzero(flat == extreme)[0])
        expected = np.full((1, 1), first) if keepdims else np.array(first)
    else:
        moved = np.moveaxis(x64, axis, -1)
        rows = moved.reshape(-1, moved.shape[-1])
        firsts = []
        for row in rows:
            extreme = row.max() if op == "argmax" else row.min()
            firsts.append(int(np.flatnonzero(row == extreme)[0]))
        expected = np.array(firsts).reshape(moved.shape[:-1])
        if keepdims:
            expected = np.expand_dims(expected, axis)
    np.testing.assert_array_equal(got, expected)


async def test_arg_reductions_pick_the_first_tie(backend: ComputeBackend) -> None:
    x = backend.tensor_factory.from_host(np.array([[1, 3, 3, 0], [0, 0, -1, -1]], np.float32))
    ops = backend.tensor_ops
    np.testing.assert_array_equal(await fetch(ops.argmax(x, axis=1)), [1, 0])
    np.testing.assert_array_equal(await fetch(ops.argmin(x, axis=1)), [3, 2])
    np.testing.assert_array_equal(await fetch(ops.argmax(x)), 1)
    np.testing.assert_array_equal(await fetch(ops.argmin(x)), 6)


async def test_reductions_of_a_0d_tensor(backend: ComputeBackend) -> None:
    x = backend.tensor_factory.from_host(np.float32(2.5))
    ops = backend.tensor_ops
    assert_close(await fetch(ops.sum(x), DType.F32), np.float32(2.5), DType.F32)
    assert_close(await fetch(ops.max(x, keepdims=True), DType.F32), np.float32(2.5), DType.F32)
    np.testing.assert_array_equal(await fetch(ops.argmax(x), DType.I64), 0)


async def test_sum_and_prod_of_empty_axes(backend: ComputeBackend) -> None:
    x = backend.tensor_factory.zeros((0, 3))
    ops = backend.tensor_ops
    np.testing.assert_array_equal(await fetch(ops.sum(x, axis=0)), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(await fetch(ops.prod(x, axis=0)), [1.0, 1.0, 1.0])
    assert (await fetch(ops.max(x, axis=1))).shape == (0,)


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=str)
async def test_low_precision_sum_and_mean_accumulate_in_f32(
    backend: ComputeBackend, dtype: DType
) -> None:
    """4096 ones: an f16 or bf16 accumulator would stop growing long before 4096."""
    require_dtype(backend, dtype)
    x = backend.tensor_factory.ones((4096,), dtype)
    assert_close(await fetch(backend.tensor_ops.sum(x), dtype), np.float64(4096.0), dtype)
    assert_close(await fetch(backend.tensor_ops.mean(x), dtype), np.float64(1.0), dtype)


async def test_integer_sum_does_not_overflow_the_input_dtype(backend: ComputeBackend) -> None:
    x = backend.tensor_factory.full((1000,), 200, DType.U8)
    np.testing.assert_array_equal(await fetch(backend.tensor_ops.sum(x), DType.U64), 200_000)
    y = backend.tensor_factory.full((1000,), -100, DType.I8)
    np.testing.assert_array_equal(await fetch(backend.tensor_ops.sum(y), DType.I64), -100_000)
    z = backend.tensor_factory.full((7,), True, DType.BOOL)
    np.testing.assert_array_equal(await fetch(backend.tensor_ops.sum(z), DType.I64), 7)


async def test_large_reduction(backend: ComputeBackend) -> None:
    x_h = sample((512, 300), DType.F32, seed=3)
    x = backend.tensor_factory.from_host(x_h)
    assert_close(
        await fetch(backend.tensor_ops.sum(x, axis=0)), f64(x_h).sum(axis=0), DType.F32, scale=50
    )
    assert_close(await fetch(backend.tensor_ops.max(x, axis=1)), f64(x_h).max(axis=1), DType.F32)


async def test_extremes_of_an_empty_axis_are_refused_everywhere(backend: ComputeBackend) -> None:
    """The one rule for empty axes (docs/operations.md): sum/prod give their identity, mean NaN,
    and max/min/argmax/argmin have no element to return, so they are refused before anything is
    allocated."""
    x = backend.tensor_factory.zeros((0, 3))
    ops = backend.tensor_ops
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    for op in ("max", "min", "argmax", "argmin"):
        with pytest.raises(InvalidArgumentError, match="empty axis"):
            ops.reduce(op, x, 0)
    with pytest.raises(InvalidArgumentError, match="empty axis"):
        ops.argmax(x, 0, last=True)
    assert backend.memory_manager.memory_info().used == used
    assert np.isnan(await fetch(ops.mean(x, axis=0))).all()


async def test_a_0d_tensor_reduces_and_softmaxes_over_its_one_element(
    backend: ComputeBackend,
) -> None:
    """axis 0 or -1 of a 0-d tensor, as PyTorch takes them (axis 0 passed the checks and then
    failed in the kernels, -1 was refused): the element, softmax 1, log_softmax 0; axis 1 is
    out of range."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    s = f.from_host(np.float32(2.0))
    for axis in (0, -1):
        for op in ("sum", "max", "mean", "prod"):
            got = ops.reduce(op, s, axis=axis)
            assert got.shape == ()
            assert (await fetch(got)).item() == 2.0, (op, axis)
        assert ops.sum(s, axis, keepdims=True).shape == ()
        assert (await fetch(ops.argmax(s, axis))).item() == 0
        assert (await fetch(ops.argmin(s, axis, last=True))).item() == 0  # a bare IndexError
        assert (await fetch(ops.softmax(s, axis))).item() == 1.0
        assert (await fetch(ops.log_softmax(s, axis))).item() == 0.0
    with pytest.raises(InvalidArgumentError):
        ops.sum(s, 1)
    with pytest.raises(InvalidArgumentError):
        ops.softmax(s, 1)
