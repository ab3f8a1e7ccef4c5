"""Indexed reductions and N-d indexing: scatter with reduce (add, multiply, max, min) and with
duplicate indices, index_add, gather_nd, scatter_nd, against loops over the index in order
(the definitions)."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import AccelError, InvalidArgumentError

from .checks import ALL_DTYPES, assert_close, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

Array = np.ndarray[Any, Any]


def _combine(reduce: str | None, a: Any, b: Any) -> Any:
    if reduce == "add":
        return a + b
    if reduce == "multiply":
        return a * b
    if reduce == "max":
        return a if (a > b or a != a) else b
    if reduce == "min":
        return a if (a < b or a != a) else b
    return b


def _scatter_loop(x: Array, axis: int, index: Array, src: Any, reduce: str | None) -> Array:
    """Visit the index in C order; each entry combines its src value into its destination."""
    out = x.astype(np.float64 if x.dtype.kind == "f" else x.dtype).copy()
    dim = x.shape[axis]
    for pos in itertools.product(*(range(d) for d in index.shape)):
        dest = list(pos)
        dest[axis] = int(index[pos]) % dim
        value = src[pos] if isinstance(src, np.ndarray) else src
        out[tuple(dest)] = _combine(reduce, out[tuple(dest)], value)
    return out


REDUCE_DTYPES: list[DType] = [d for d in ALL_DTYPES if d is not DType.BOOL]


@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=ids(REDUCE_DTYPES))
@pytest.mark.parametrize("reduce", ["add", "multiply", "max", "min"])
async def test_scatter_with_a_reduction(backend: ComputeBackend, dtype: DType, reduce: str) -> None:
    require_op(backend, "scatter")
    require_dtype(backend, dtype)
    x_h = sample((5, 6), dtype, low=0 if dtype is DType.U8 else -3, high=3, seed=81)
    src_h = sample((4, 6), dtype, low=0 if dtype is DType.U8 else -3, high=3, seed=82)
    index_h = np.array(
        [[0, 1, 0, 4, 4, 2], [2, 2, 2, 1, 0, 0], [0, 0, 0, 0, -1, -5], [3, 3, 1, 1, 2, 2]]
    )
    f = backend.tensor_factory
    for axis, index, src in ((0, index_h, src_h), (1, index_h[:2, :4] % 6, src_h[:3, :5])):
        got = backend.tensor_ops.scatter(
            f.from_host(x_h), axis, f.from_host(index), f.from_host(src), reduce
        )
        want = _scatter_loop(x_h, axis, index, src, reduce)
        assert_close(await fetch(got, dtype), want.astype(x_h.dtype), dtype, scale=4.0)
    got = backend.tensor_ops.scatter(f.from_host(x_h), 0, f.from_host(index_h[:2]), 2, reduce)
    want = _scatter_loop(x_h, 0, index_h[:2], 2, reduce)
    assert_close(await fetch(got, dtype), want.astype(x_h.dtype), dtype, scale=4.0)


@pytest.mark.parametrize("reduce", ["max", "min", "add"])
async def test_scatter_reduce_keeps_nan_at_its_destination(
    backend: ComputeBackend, reduce: str
) -> None:
    require_op(backend, "scatter")
    x_h = np.zeros((3, 2), np.float32)
    src_h = np.array([[np.nan, 1.0], [2.0, 3.0]], np.float32)
    index_h = np.array([[0, 0], [1, 2]])
    f = backend.tensor_factory
    got = await fetch(
        backend.tensor_ops.scatter(
            f.from_host(x_h), 0, f.from_host(index_h), f.from_host(src_h), reduce
        )
    )
    np.testing.assert_array_equal(np.isnan(got), [[True, False], [False, False], [False, False]])


async def test_duplicate_indices_keep_the_last_write_on_every_run(backend: ComputeBackend) -> None:
    require_op(backend, "scatter")
    n = 257
    index_h = np.zeros((n, 3), np.int64)
    index_h[:, 2] = np.arange(n) % 4
    src_h = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    f = backend.tensor_factory
    x = f.zeros((4, 3))
    want = _scatter_loop(np.zeros((4, 3), np.float32), 0, index_h, src_h, None)
    for _ in range(3):
        got = await fetch(
            backend.tensor_ops.scatter(x, 0, f.from_host(index_h), f.from_host(src_h))
        )
        np.testing.assert_array_equal(got, want)


async def test_index_add(backend: ComputeBackend) -> None:
    require_op(backend, "index_add")
    x_h = sample((4, 5), DType.F32, seed=83)
    src_h = sample((4, 3), DType.F32, seed=84)
    index_h = np.array([4, 0, 4])
    f = backend.tensor_factory
    got = backend.tensor_ops.index_add(
        f.from_host(x_h), 1, f.from_host(index_h), f.from_host(src_h), alpha=0.5
    )
    want = x_h.astype(np.float64)
    for i, j in enumerate(index_h):
        want[:, j] += 0.5 * src_h[:, i]
    assert_close(await fetch(got), want, DType.F32, scale=2.0)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids(ALL_DTYPES))
async def test_gather_nd_and_scatter_nd(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "gather_nd", "scatter_nd")
    require_dtype(backend, dtype)
    x_h = sample((3, 4, 2), dtype, low=-9, high=9, seed=85)
    f, ops = backend.tensor_factory, backend.tensor_ops
    points = np.array([[[0, 1], [2, 3]], [[1, 0], [2, 3]]])
    rows = np.array([[2], [0], [2]])
    np.testing.assert_array_equal(
        await fetch(ops.gather_nd(f.from_host(x_h), f.from_host(points)), dtype),
        x_h[points[..., 0], points[..., 1]],
    )
    np.testing.assert_array_equal(
        await fetch(ops.gather_nd(f.from_host(x_h), f.from_host(rows)), dtype), x_h[rows[:, 0]]
    )
    updates = sample((2, 2, 2), dtype, low=-9, high=9, seed=86)
    want = x_h.copy()
    for pos in itertools.product(range(2), range(2)):  # in order: the last duplicate wins
        want[points[pos][0], points[pos][1]] = updates[pos]
    got = ops.scatter_nd(f.from_host(x_h), f.from_host(points), f.from_host(updates))
    np.testing.assert_array_equal(await fetch(got, dtype), want)
    if dtype is not DType.BOOL:
        want = x_h.astype(np.float64 if dtype.is_floating else x_h.dtype).copy()
        for pos in itertools.product(range(2), range(2)):
            want[points[pos][0], points[pos][1]] += updates[pos]
        got = ops.scatter_nd(f.from_host(x_h), f.from_host(points), f.from_host(updates), "add")
        assert_close(await fetch(got, dtype), want.astype(x_h.dtype), dtype, scale=2.0)


async def test_nd_indices_out_of_range_are_reported(backend: ComputeBackend) -> None:
    require_op(backend, "gather_nd")
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.ones((3, 4))
    for bad in ([[0, 4]], [[3, 0]], [[-1, 0]]):
        with pytest.raises(InvalidArgumentError):
            await ops.gather_nd(x, f.from_host(np.array(bad))).to_host()
    with pytest.raises(InvalidArgumentError):
        await ops.scatter(x, 0, f.from_host(np.array([[3, 0]])), 1.0, "add").to_host()


@pytest.mark.parametrize("dtype", [DType.U64, DType.U32, DType.U8], ids=str)
async def test_an_unsigned_index_beyond_the_axis_is_reported_not_wrapped(
    backend: ComputeBackend, dtype: DType
) -> None:
    """An unsigned index holds no negative number to count from the end: U64's 2**64 - 1 is
    out of range (the core's composition of a reducing scatter cast it to I64, -1, and wrote
    to the last slot)."""
    require_dtype(backend, dtype)
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.zeros((2, 4), np.float32))
    src = f.from_host(np.ones((2, 1), np.float32))
    top = int(np.iinfo(dtype.to_numpy()).max)
    for bad in (top, 4):
        index = f.from_host(np.array([bad], dtype.to_numpy()))
        with pytest.raises(InvalidArgumentError):
            await ops.index_add(x, 1, index, src).to_host()
        full = f.from_host(np.array([[bad], [bad]], dtype.to_numpy()))
        for reduce in ("add", "max"):
            with pytest.raises(InvalidArgumentError):
                await ops.scatter(x, 1, full, src, reduce).to_host()
    ok = f.from_host(np.array([[3], [0]], dtype.to_numpy()))
    want = np.zeros((2, 4), np.float32)
    want[0, 3] = want[1, 0] = 1.0
    np.testing.assert_array_equal(await fetch(ops.scatter(x, 1, ok, src, "add")), want)


async def test_every_failure_an_await_covers_is_its_own_not_the_next_await_s(
    backend: ComputeBackend,
) -> None:
    """A scatter_nd with an index out of range fails in two kernels of its composition (the
    index check and the scatter after it): its await raises, and the await of a later, valid
    add returns the add's result (it raised the scatter's leftover error, with a message read
    from uninitialized memory)."""
    require_op(backend, "scatter_nd")
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(6, dtype=np.float32).reshape(2, 3))
    bad = ops.scatter_nd(x, f.from_host(np.array([[0, 7]])), f.from_host(np.array([9.0], "f4")))
    with pytest.raises(InvalidArgumentError):
        await bad.to_host()
    good = ops.add(x, 1.0)
    np.testing.assert_array_equal(await good.to_host(), np.arange(1.0, 7.0).reshape(2, 3))
    await backend.synchronize()


async def test_another_task_s_failure_is_still_raised_by_its_own_await(
    backend: ComputeBackend,
) -> None:
    """Task A's failed scatter_nd, then task B's, then A awaits a later valid op: on a backend
    whose awaits report by stream position, A's await raises A's failure (B's named in a note),
    and B's await of its own result still raises (it returned uninitialized memory); an await
    of later work then raises nothing stale. (A backend that reports errors through the data
    a result depends on, as Dask does, raises nothing at A's await of the unrelated op.)"""
    require_op(backend, "scatter_nd")
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.from_host(np.arange(6, dtype=np.float32).reshape(2, 3))
    upd = f.from_host(np.array([9.0], "f4"))
    a_bad = ops.scatter_nd(x, f.from_host(np.array([[0, 7]])), upd)
    b_bad = ops.scatter_nd(x, f.from_host(np.array([[5, 0]])), upd)
    a_later = ops.add(x, 1.0)
    with contextlib.suppress(InvalidArgumentError):  # by position: A's, B's as a note
        await a_later.to_host()
    with pytest.raises(InvalidArgumentError):
        await b_bad.to_host()
    np.testing.assert_array_equal(
        await ops.add(x, 2.0).to_host(), np.arange(2.0, 8.0).reshape(2, 3)
    )
    del a_bad


BAD_CALLS: list[tuple[str, Any, str]] = [
    ("scatter", lambda o, t: o.scatter(t["x"], 0, t["i"], t["x"], "mean"), "reduce must be"),
    ("scatter", lambda o, t: o.scatter(t["flags"], 0, t["i"], True, "add"), "bool"),
    ("scatter", lambda o, t: o.scatter(t["x"], 0, t["i"], t["xi"], "add"), "cast"),
    ("scatter", lambda o, t: o.scatter(t["x"], 0, t["i"], 1.5j, "add"), "src"),
    ("index_add", lambda o, t: o.index_add(t["x"], 0, t["i"], t["x"]), "1-d"),
    ("index_add", lambda o, t: o.index_add(t["x"], 0, t["i1"], t["x"]), "src must be"),
    ("index_add", lambda o, t: o.index_add(t["xi"], 0, t["iv"], t["xi"], 0.5), "alpha must be an int"),
    ("gather_nd", lambda o, t: o.gather_nd(t["x"], t["x"]), "integer"),
    ("gather_nd", lambda o, t: o.gather_nd(t["x"], t["i3"]), "1 <= K"),
    ("scatter_nd", lambda o, t: o.scatter_nd(t["x"], t["i2"], t["x"]), "updates must be"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "call", "message"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
async def test_bad_arguments_are_refused_before_allocating(
    backend: ComputeBackend, op: str, call: Any, message: str
) -> None:
    require_op(backend, op)
    f = backend.tensor_factory
    inputs = {
        "x": f.ones((2, 3)), "xi": f.ones((2, 3), "i32"), "flags": f.ones((2, 3), "bool"),
        "i": f.zeros((2, 3), "i64"), "i1": f.zeros((5,), "i64"), "i3": f.zeros((2, 3), "i64"), "i2": f.zeros((4, 2), "i64"),
        "iv": f.zeros((2,), "i64"),
    }  # fmt: skip
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(AccelError, match=message):
        call(backend.tensor_ops, inputs)
    assert backend.memory_manager.memory_info().used == used
