"""Shape ops: reshape (a view), permute, transpose, concat, stack, narrow, split, gather, scatter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType

from .checks import ALL_DTYPES, fetch, ids, require_dtype, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

DTYPES = [DType.F32, DType.F64, DType.F16, DType.BF16, DType.I8, DType.I64, DType.U16, DType.BOOL]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ids(ALL_DTYPES))
async def test_reshape_is_a_view_with_the_same_elements(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    x_h = sample((2, 3, 4), dtype, seed=1)
    x = backend.tensor_factory.from_host(x_h)
    ops = backend.tensor_ops
    for shape, expected in (
        ((4, 6), (4, 6)),
        ((-1, 2), (12, 2)),
        (24, (24,)),
        ((2, -1, 3), (2, 4, 3)),
    ):
        y = ops.reshape(x, shape)
        assert y.shape == expected
        assert y.buffer is x.buffer  # shares the buffer: no copy
        np.testing.assert_array_equal(await fetch(y, dtype), x_h.reshape(expected))
    np.testing.assert_array_equal(await fetch(ops.reshape(x, ()) if x.size == 1 else x, dtype), x_h)


async def test_reshape_to_and_from_0d(backend: ComputeBackend) -> None:
    ops = backend.tensor_ops
    x = backend.tensor_factory.from_host(np.array([5.0], np.float32))
    s = ops.reshape(x, ())
    assert s.shape == ()
    np.testing.assert_array_equal(await fetch(s), np.float32(5.0))
    np.testing.assert_array_equal(await fetch(ops.reshape(s, (1, 1))), [[5.0]])


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_reshape_sees_later_writes_through_the_shared_buffer(
    backend: ComputeBackend, busy: bool
) -> None:
    """A read through a view waits for a later write through another view of its buffer, also
    when the stream is busy and the write is queued behind other work (the view's own last
    writer is older than the write)."""
    f, ops = backend.tensor_factory, backend.tensor_ops
    big = f.ones((384, 384))
    for _ in range(5):
        pending = ops.matmul(big, big) if busy else None
        x = f.zeros((2, 3))
        view = ops.reshape(x, (6,))
        backend.memory_manager.copy_dtod(x, f.ones((2, 3)))
        np.testing.assert_array_equal(await fetch(view), np.ones(6, np.float32))
        del pending


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
@pytest.mark.parametrize("dims", [(0, 1, 2), (2, 0, 1), (1, 0, 2), (2, 1, 0)])
async def test_permute(backend: ComputeBackend, dtype: DType, dims: tuple[int, ...]) -> None:
    require_dtype(backend, dtype)
    x_h = sample((2, 3, 4), dtype, seed=2)
    y = backend.tensor_ops.permute(backend.tensor_factory.from_host(x_h), dims)
    expected = np.empty(tuple(x_h.shape[d] for d in dims), x_h.dtype)
    for idx in np.ndindex(*x_h.shape):
        expected[tuple(idx[d] for d in dims)] = x_h[idx]
    np.testing.assert_array_equal(await fetch(y, dtype), expected)


async def test_permute_negative_dims(backend: ComputeBackend) -> None:
    x_h = sample((2, 3, 4), DType.F32, seed=2)
    y = backend.tensor_ops.permute(backend.tensor_factory.from_host(x_h), (-1, 0, -2))
    np.testing.assert_array_equal(await fetch(y), x_h.transpose(2, 0, 1))


@pytest.mark.parametrize(("dim0", "dim1"), [(None, None), (0, 2), (-3, -1), (1, 1)])
async def test_transpose(
    backend: ComputeBackend,
    dim0: int | None,
    dim1: Any,  # None exactly where dim0 is
) -> None:
    x_h = sample((2, 3, 4), DType.I32, seed=3)
    x = backend.tensor_factory.from_host(x_h)
    if dim0 is None:
        y, expected = backend.tensor_ops.transpose(x), np.swapaxes(x_h, -2, -1)
    else:
        y, expected = backend.tensor_ops.transpose(x, dim0, dim1), np.swapaxes(x_h, dim0, dim1)
    np.testing.assert_array_equal(await fetch(y, DType.I32), expected)


async def test_transpose_of_a_large_matrix(backend: ComputeBackend) -> None:
    x_h = sample((300, 200), DType.F32, seed=4)
    y = backend.tensor_ops.transpose(backend.tensor_factory.from_host(x_h))
    np.testing.assert_array_equal(await fetch(y), x_h.T)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
@pytest.mark.parametrize("axis", [0, 1, -1])
async def test_concat(backend: ComputeBackend, dtype: DType, axis: int) -> None:
    require_dtype(backend, dtype)
    ax = axis % 3
    shapes = [tuple(n if d == ax else (2, 3, 4)[d] for d in range(3)) for n in (1, 3, 2)]
    parts = [sample(s, dtype, seed=i) for i, s in enumerate(shapes)]
    f = backend.tensor_factory
    y = backend.tensor_ops.concat([f.from_host(p) for p in parts], axis=axis)
    np.testing.assert_array_equal(await fetch(y, dtype), np.concatenate(parts, axis=axis))


async def test_concat_single_and_empty_parts(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    a = f.from_host(np.arange(3, dtype=np.int64))
    np.testing.assert_array_equal(await fetch(backend.tensor_ops.concat([a])), [0, 1, 2])
    y = backend.tensor_ops.concat([f.zeros((0,), DType.I64), a, f.zeros((0,), DType.I64)])
    np.testing.assert_array_equal(await fetch(y), [0, 1, 2])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
async def test_stack(backend: ComputeBackend, dtype: DType, axis: int) -> None:
    require_dtype(backend, dtype)
    parts = [sample((2, 3), dtype, seed=i) for i in range(3)]
    f = backend.tensor_factory
    y = backend.tensor_ops.stack([f.from_host(p) for p in parts], axis=axis)
    np.testing.assert_array_equal(await fetch(y, dtype), np.stack(parts, axis=axis))


@pytest.mark.parametrize(
    ("axis", "start", "length"),
    [(0, 1, 2), (1, 0, 4), (2, 3, 2), (-1, -2, 2), (1, 4, 0), (0, 0, 3)],
)
async def test_narrow(backend: ComputeBackend, axis: int, start: int, length: int) -> None:
    x_h = sample((3, 4, 5), DType.F32, seed=5)
    y = backend.tensor_ops.narrow(backend.tensor_factory.from_host(x_h), axis, start, length)
    dim = x_h.shape[axis]
    s = start + dim if start < 0 else start
    expected = np.take(x_h, np.arange(s, s + length), axis=axis)
    np.testing.assert_array_equal(await fetch(y), expected)


@pytest.mark.parametrize(
    ("sections", "axis", "sizes"),
    [(3, 0, [2, 2, 2]), ([1, 0, 5], 0, [1, 0, 5]), (2, 1, [2, 2]), ([3, 1], -1, [3, 1])],
)
async def test_split(
    backend: ComputeBackend, sections: int | list[int], axis: int, sizes: list[int]
) -> None:
    x_h = sample((6, 4), DType.I32, seed=6)
    parts = backend.tensor_ops.split(backend.tensor_factory.from_host(x_h), sections, axis=axis)
    assert len(parts) == len(sizes)
    start = 0
    for part, size in zip(parts, sizes, strict=True):
        expected = np.take(x_h, np.arange(start, start + size), axis=axis)
        np.testing.assert_array_equal(await fetch(part, DType.I32), expected)
        start += size


@pytest.mark.parametrize("index_dtype", [DType.I64, DType.I32, DType.U8], ids=str)
@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.I16, DType.BOOL], ids=str)
@pytest.mark.parametrize("axis", [0, 1])
async def test_gather(backend: ComputeBackend, axis: int, dtype: DType, index_dtype: DType) -> None:
    require_dtype(backend, dtype, index_dtype)
    x_h = sample((4, 5), dtype, seed=7)
    idx_shape = (3, 4) if axis == 0 else (2, 6)  # smaller than x off the axis, any size along it
    rng = np.random.default_rng(0)
    idx_h = rng.integers(0, x_h.shape[axis], size=idx_shape).astype(index_dtype.to_numpy())
    f = backend.tensor_factory
    y = backend.tensor_ops.gather(f.from_host(x_h), axis, f.from_host(idx_h))
    expected = np.empty(idx_shape, x_h.dtype)
    for i, j in np.ndindex(*idx_shape):
        expected[i, j] = x_h[idx_h[i, j], j] if axis == 0 else x_h[i, idx_h[i, j]]
    np.testing.assert_array_equal(await fetch(y, dtype), expected)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I64, DType.U8], ids=str)
@pytest.mark.parametrize("axis", [0, 1])
async def test_scatter_tensor_src(backend: ComputeBackend, axis: int, dtype: DType) -> None:
    require_dtype(backend, dtype)
    x_h = sample((4, 5), dtype, low=0, high=9, seed=1)
    src_h = sample((3, 5), dtype, low=10, high=20, seed=2)  # larger than index: its corner is used
    # Distinct targets along the axis (a permutation per row/column), so the result is defined.
    if axis == 0:
        idx_h = np.stack([np.random.default_rng(c).permutation(4)[:2] for c in range(4)], axis=1)
    else:
        idx_h = np.stack([np.random.default_rng(r).permutation(5)[:3] for r in range(2)], axis=0)
    f = backend.tensor_factory
    y = backend.tensor_ops.scatter(f.from_host(x_h), axis, f.from_host(idx_h), f.from_host(src_h))
    expected = x_h.copy()
    for i, j in np.ndindex(*idx_h.shape):
        if axis == 0:
            expected[idx_h[i, j], j] = src_h[i, j]
        else:
            expected[i, idx_h[i, j]] = src_h[i, j]
    np.testing.assert_array_equal(await fetch(y, dtype), expected)


async def test_scatter_scalar_src_and_duplicates_keep_the_last_write(
    backend: ComputeBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    x = f.zeros((3, 2))
    y = ops.scatter(x, 0, f.from_host([[2, 1]]), 5.0)
    np.testing.assert_array_equal(await fetch(y), [[0, 0], [0, 5], [5, 0]])
    dup = ops.scatter(x, 0, f.from_host([[0, 1], [0, 1]]), f.from_host([[1.0, 2.0], [3.0, 4.0]]))
    np.testing.assert_array_equal(await fetch(dup), [[3, 0], [0, 4], [0, 0]])
    # Out of place: x is unchanged.
    np.testing.assert_array_equal(await fetch(x), np.zeros((3, 2), np.float32))
