"""Scans and sorting: cumsum/cumprod (inclusive, exclusive, reverse), sort/argsort (stable, NaN
largest, both directions), topk, and argmax/argmin's last occurrence; references are NumPy's
float64 cumsum and stable argsort, and Python's sorted() for the order rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import AccelError
from accelkit.ops._mixins.scan import scan_dtype

from .checks import ALL_DTYPES, assert_close, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

SCAN_DTYPES = ALL_DTYPES
SORT_DTYPES = ALL_DTYPES


def _reference_scan(
    x: np.ndarray[Any, Any], op: str, axis: int, exclusive: bool, reverse: bool, out: Any
) -> np.ndarray[Any, Any]:
    """A sequential scan in ``out``'s dtype (float64 for floats: the exact reference)."""
    acc = np.float64 if np.dtype(out).kind == "f" else out
    xs = np.moveaxis(x.astype(acc), axis, -1)
    if reverse:
        xs = xs[..., ::-1]
    res = np.empty_like(xs)
    run = np.zeros(xs.shape[:-1], acc) + (0 if op == "sum" else 1)
    with np.errstate(over="ignore"):
        for i in range(xs.shape[-1]):
            if not exclusive:
                run = run + xs[..., i] if op == "sum" else run * xs[..., i]
            res[..., i] = run
            if exclusive:
                run = run + xs[..., i] if op == "sum" else run * xs[..., i]
    if reverse:
        res = res[..., ::-1]
    return np.moveaxis(res, -1, axis)


@pytest.mark.parametrize("dtype", SCAN_DTYPES, ids=ids(SCAN_DTYPES))
@pytest.mark.parametrize("op", ["sum", "prod"])
async def test_cumulative(backend: ComputeBackend, op: str, dtype: DType) -> None:
    name = "cumsum" if op == "sum" else "cumprod"
    require_op(backend, name)
    require_dtype(backend, dtype)
    # Products of values near 1 stay in range; sums of small integers stay exact.
    lo, hi = (0.5, 1.5) if op == "prod" and dtype.is_floating else (-3, 3)
    x_h = sample((3, 37, 4), dtype, low=lo, high=hi, seed=11)
    x = backend.tensor_factory.from_host(x_h)
    fn = getattr(backend.tensor_ops, name)
    for axis in (1, 0, -1):
        for exclusive in (False, True):
            for reverse in (False, True):
                got = fn(x, axis, exclusive=exclusive, reverse=reverse)
                want_dt = scan_dtype(dtype)
                assert got.dtype is want_dt
                want = _reference_scan(x_h, op, axis, exclusive, reverse, want_dt.to_numpy())
                # A sum of n terms rounds about log2(n) times more than one addition.
                assert_close(await fetch(got), want, dtype, scale=8.0)


async def test_integer_scans_wrap_like_a_loop(backend: ComputeBackend) -> None:
    require_op(backend, "cumsum", "cumprod")
    require_dtype(backend, DType.I64)
    big = np.array([2**62, 2**62, 2**62, -5, 7], np.int64)
    f, ops = backend.tensor_factory, backend.tensor_ops
    got = await fetch(ops.cumsum(f.from_host(big), 0))
    np.testing.assert_array_equal(got, _reference_scan(big, "sum", 0, False, False, np.int64))
    got = await fetch(ops.cumprod(f.from_host(np.array([3] * 45, np.int64)), 0))
    np.testing.assert_array_equal(
        got, _reference_scan(np.full(45, 3), "prod", 0, False, False, np.int64)
    )


async def test_scans_of_empty_and_single_axes(backend: ComputeBackend) -> None:
    require_op(backend, "cumsum")
    f, ops = backend.tensor_factory, backend.tensor_ops
    assert (await fetch(ops.cumsum(f.zeros((0, 3)), 0))).shape == (0, 3)
    # An empty scan has the dtype a non-empty one has (F16/BF16 came back F32 when composed).
    for dtype in (DType.F16, DType.BF16, DType.F32, DType.I32):
        if dtype in backend.capabilities.dtypes:
            for shape, axis in (((2, 0), 1), ((0, 3), 0)):
                empty, full = f.zeros(shape, dtype), f.zeros((2, 3), dtype)
                for scan in (ops.cumsum, ops.cumprod):
                    assert scan(empty, axis).dtype is scan(full, axis).dtype, (dtype, scan)
    one = await fetch(ops.cumsum(f.full((2, 1), 4.0), 1, exclusive=True))
    np.testing.assert_array_equal(one, [[0.0], [0.0]])


def _order(values: list[Any], descending: bool) -> list[int]:
    """Python's stable sorted() with NaN largest: the documented order."""

    def key(i: int) -> tuple[int, Any]:
        v = values[i]
        nan = isinstance(v, float) and v != v
        if descending:
            return (0, 0) if nan else (1, -v)
        return (1, 0) if nan else (0, v)

    return sorted(range(len(values)), key=key)


@pytest.mark.parametrize("dtype", SORT_DTYPES, ids=ids(SORT_DTYPES))
@pytest.mark.parametrize("descending", [False, True], ids=["up", "down"])
async def test_sort_and_argsort_are_stable_with_nan_largest(
    backend: ComputeBackend, dtype: DType, descending: bool
) -> None:
    require_op(backend, "sort", "argsort")
    require_dtype(backend, dtype)
    # Few distinct values, so that ties are everywhere; 45 is not a power of two.
    x_h = sample((3, 45), dtype, low=-3, high=3, seed=5)
    if dtype.is_floating:
        x_h[0, [3, 17, 40]] = np.nan
        x_h[1, 7] = np.inf
        x_h[2, [0, 44]] = -np.inf
    x = backend.tensor_factory.from_host(x_h)
    ops = backend.tensor_ops
    idx = await fetch(ops.argsort(x, descending=descending), DType.I64)
    for row in range(3):
        values = [v.item() if not dtype.is_floating else float(v) for v in x_h[row]]
        assert idx[row].tolist() == _order(values, descending), f"row {row}"
    sorted_h = await fetch(ops.sort(x, descending=descending), dtype)
    wide = np.float64 if dtype.is_floating else sorted_h.dtype  # bf16 NaN compares in float64
    np.testing.assert_array_equal(
        sorted_h.astype(wide), np.take_along_axis(x_h, idx, -1).astype(wide)
    )


@pytest.mark.parametrize("axis", [0, 1])
async def test_argsort_along_any_axis(backend: ComputeBackend, axis: int) -> None:
    require_op(backend, "argsort")
    x_h = sample((33, 6, 2), DType.F32, seed=9)
    x = backend.tensor_factory.from_host(x_h)
    got = await fetch(backend.tensor_ops.argsort(x, axis))
    np.testing.assert_array_equal(got, np.argsort(x_h, axis, kind="stable"))


async def test_sort_of_tiny_and_empty_rows(backend: ComputeBackend) -> None:
    require_op(backend, "sort", "argsort")
    f, ops = backend.tensor_factory, backend.tensor_ops
    assert (await fetch(ops.argsort(f.zeros((3, 0))))).shape == (3, 0)
    np.testing.assert_array_equal(await fetch(ops.argsort(f.ones((2, 1)))), [[0], [0]])
    np.testing.assert_array_equal(
        await fetch(ops.sort(f.from_host(np.array([2.0, 1.0], np.float32)))), [1.0, 2.0]
    )


@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
async def test_topk(backend: ComputeBackend, largest: bool) -> None:
    require_op(backend, "topk")
    x_h = sample((4, 50), DType.F32, seed=13)
    x_h[1, 10] = np.nan
    x_h[2, 5] = x_h[2, 30]  # a tie
    f, ops = backend.tensor_factory, backend.tensor_ops
    for k in (0, 1, 7, 50):
        values, indices = ops.topk(f.from_host(x_h), k, largest=largest)
        got_i = await fetch(indices, DType.I64)
        for row in range(4):
            assert got_i[row].tolist() == _order([float(v) for v in x_h[row]], largest)[:k]
        np.testing.assert_array_equal(await fetch(values), np.take_along_axis(x_h, got_i, -1))
    values, indices = ops.topk(f.from_host(x_h), 3, axis=0)
    np.testing.assert_array_equal(
        await fetch(indices), np.argsort(-np.nan_to_num(x_h, nan=np.inf), 0, kind="stable")[:3]
    )


async def test_argmax_and_argmin_last_occurrence(backend: ComputeBackend) -> None:
    require_op(backend, "argmax", "argmin")
    a = np.array([[1, 3, 3, 0, 0], [2, 2, 1, 2, 1]], np.float32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(a)
    np.testing.assert_array_equal(await fetch(ops.argmax(x, 1, last=True)), [2, 3])
    np.testing.assert_array_equal(await fetch(ops.argmin(x, 1, last=True)), [4, 4])
    np.testing.assert_array_equal(await fetch(ops.argmax(x, 0, last=True)), [1, 0, 0, 1, 1])
    np.testing.assert_array_equal(await fetch(ops.argmax(x, 1)), [1, 0])  # first, as before
    assert int(await fetch(ops.argmax(x, last=True))) == 2
    assert int(await fetch(ops.argmin(x, last=True))) == 4
    kept = ops.argmax(x, 1, keepdims=True, last=True)
    assert kept.shape == (2, 1)
    np.testing.assert_array_equal(await fetch(kept), [[2], [3]])


BAD_CALLS: list[tuple[str, Any, str]] = [
    ("cumsum", lambda o, x: o.cumsum(x, 2), "axis"),
    ("cumsum", lambda o, x: o.cumsum(x, 0, exclusive=1), "exclusive must be a bool"),
    ("cumprod", lambda o, x: o.cumprod(x, 0), "at least 1"),  # x is 0-d
    ("sort", lambda o, x: o.sort(x, 3), "axis"),
    ("argsort", lambda o, x: o.argsort(x, descending="yes"), "descending must be a bool"),
    ("topk", lambda o, x: o.topk(x, 5), "more than"),
    ("topk", lambda o, x: o.topk(x, -1), "k"),
    ("argmax", lambda o, x: o.argmax(x, 0, last="no"), "last must be a bool"),
    ("argmin", lambda o, x: o.argmin(x, 1, last=True), "empty axis"),  # x is [1, 0]
]


@pytest.mark.parametrize(
    ("op", "call", "message"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
async def test_bad_arguments_are_refused_before_allocating(
    backend: ComputeBackend, op: str, call: Any, message: str
) -> None:
    require_op(backend, op)
    ops = backend.tensor_ops
    x = backend.tensor_factory.ones((1, 4))
    if "empty" in message:
        x = ops.narrow(x, 1, 0, 0)
    elif "at least 1" in message:
        x = backend.tensor_factory.ones(())
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(AccelError, match=message):
        call(ops, x)
    assert backend.memory_manager.memory_info().used == used
