"""Rearranging ops: flip, broadcast_to, tile, pad (every mode), narrow with a step, tril/triu,
one_hot and eye with an offset, against NumPy's functions of the same names."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import AccelError, InvalidArgumentError

from .checks import ALL_DTYPES, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

DTYPES = ALL_DTYPES


def _x(backend: ComputeBackend, dtype: DType, shape: tuple[int, ...] = (2, 3, 5)) -> Any:
    require_dtype(backend, dtype)
    x_h = sample(shape, dtype, low=-50, high=50, seed=7)
    return x_h, backend.tensor_factory.from_host(x_h)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
async def test_flip(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "flip")
    x_h, x = _x(backend, dtype)
    ops = backend.tensor_ops
    for axis in (0, 1, -1, (0, 2), None):
        got = await fetch(ops.flip(x, axis), dtype)
        np.testing.assert_array_equal(got, np.flip(x_h, axis), err_msg=f"axis={axis}")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
async def test_broadcast_to_and_tile(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "broadcast_to", "tile")
    x_h, x = _x(backend, dtype, (3, 1, 4))
    ops = backend.tensor_ops
    for shape in ((3, 2, 4), (2, 3, 5, 4), (3, 1, 4), (0, 3, 1, 4)):
        got = await fetch(ops.broadcast_to(x, shape), dtype)
        np.testing.assert_array_equal(got, np.broadcast_to(x_h, shape), err_msg=str(shape))
    for reps in (2, (2, 1, 3), (2, 1, 1, 2), (1, 0, 1)):
        got = await fetch(ops.tile(x, reps), dtype)
        np.testing.assert_array_equal(got, np.tile(x_h, reps), err_msg=str(reps))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric", "wrap"])
async def test_pad(backend: ComputeBackend, dtype: DType, mode: str) -> None:
    require_op(backend, "pad")
    x_h, x = _x(backend, dtype)
    ops = backend.tensor_ops
    value: Any = True if dtype is DType.BOOL else 3
    for width in ([(1, 2), (0, 1), (3, 0)], 2, (0, 1), [(0, 0), (4, 4), (7, 1)]):
        kw = {"value": value} if mode == "constant" else {}
        np_kw = {"constant_values": value} if mode == "constant" else {}
        got = await fetch(ops.pad(x, width, mode, **kw), dtype)
        want = np.pad(x_h, width, mode, **np_kw)  # type: ignore[call-overload]
        np.testing.assert_array_equal(got, want, err_msg=f"{mode} {width}")


async def test_pad_float_value_and_nan(backend: ComputeBackend) -> None:
    require_op(backend, "pad")
    x_h, x = _x(backend, DType.F32, (2, 2))
    got = await fetch(backend.tensor_ops.pad(x, 1, value=float("nan")))
    np.testing.assert_array_equal(got, np.pad(x_h, 1, constant_values=np.nan))


@pytest.mark.parametrize("dtype", [DType.F32, DType.I64], ids=ids([DType.F32, DType.I64]))
async def test_narrow_with_a_step(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "narrow")
    x_h, x = _x(backend, dtype, (3, 10))
    ops = backend.tensor_ops
    cases = [
        (1, 4, 2, 1),
        (0, 2, 1, 1),
        (1, 2, 3, 3),
        (1, 9, 10, -1),
        (1, -1, 4, -3),
        (0, 2, 0, -1),
        (1, 0, 1, 5),
    ]
    for axis, start, length, step in cases:
        s = start + x_h.shape[axis] if start < 0 else start
        index = [s + i * step for i in range(length)]
        got = await fetch(ops.narrow(x, axis, start, length, step), dtype)
        np.testing.assert_array_equal(got, np.take(x_h, index, axis), err_msg=str(index))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids(DTYPES))
async def test_tril_triu(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "tril", "triu")
    x_h, x = _x(backend, dtype, (2, 4, 6))
    ops = backend.tensor_ops
    for k in (0, 1, -2, 10, -10):
        np.testing.assert_array_equal(await fetch(ops.tril(x, k), dtype), np.tril(x_h, k))
        np.testing.assert_array_equal(await fetch(ops.triu(x, k), dtype), np.triu(x_h, k))


async def test_eye_with_an_offset(backend: ComputeBackend) -> None:
    f = backend.tensor_factory
    for n, m, k in ((3, None, 0), (3, 5, 1), (4, 2, -1), (2, 3, 5)):
        np.testing.assert_array_equal(await fetch(f.eye(n, m, k=k)), np.eye(n, m, k))
    require_dtype(backend, DType.I32)
    np.testing.assert_array_equal(
        await fetch(f.eye(3, dtype=DType.I32, k=-1), DType.I32), np.eye(3, k=-1, dtype=np.int32)
    )


HOT_DTYPES = [DType.I64, DType.F32, DType.BOOL]


@pytest.mark.parametrize("dtype", HOT_DTYPES, ids=ids(HOT_DTYPES))
async def test_one_hot(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "one_hot")
    require_dtype(backend, DType.I32)
    idx = np.array([[0, 4, 2], [1, 1, 3]], np.int32)
    f, ops = backend.tensor_factory, backend.tensor_ops
    got = await fetch(ops.one_hot(f.from_host(idx), 5, dtype), dtype)
    np.testing.assert_array_equal(got, np.eye(5, dtype=dtype.to_numpy())[idx])


@pytest.mark.parametrize("bad", [5, -1])
async def test_one_hot_reports_an_index_out_of_range(backend: ComputeBackend, bad: int) -> None:
    require_op(backend, "one_hot")
    f, ops = backend.tensor_factory, backend.tensor_ops
    hot = ops.one_hot(f.from_host(np.array([0, bad], np.int64)), 5)
    with pytest.raises(InvalidArgumentError):
        await hot.to_host()


F32, U8, I32 = DType.F32, DType.U8, DType.I32
BAD_CALLS: list[tuple[str, DType, Any, str]] = [
    ("pad", F32, lambda o, x: o.pad(x, -1), "pad_width"),
    ("pad", F32, lambda o, x: o.pad(x, [(1, 1)]), "pad_width"),
    ("pad", F32, lambda o, x: o.pad(x, 1, "mirror"), "unknown mode"),
    ("pad", I32, lambda o, x: o.pad(x, 1, value=1.5), "does not fit"),
    ("pad", U8, lambda o, x: o.pad(x, 1, value=300), "does not fit"),
    ("broadcast_to", F32, lambda o, x: o.broadcast_to(x, (3, 4)), "does not broadcast"),
    ("broadcast_to", F32, lambda o, x: o.broadcast_to(x, (2, -3, 4)), "negative"),
    ("broadcast_to", F32, lambda o, x: o.broadcast_to(x, None), "shape"),
    ("tile", F32, lambda o, x: o.tile(x, (-1, 2)), "negative"),
    ("flip", F32, lambda o, x: o.flip(x, (0, 0)), "repeats"),
    ("flip", F32, lambda o, x: o.flip(x, 5), "axis"),
    ("narrow", F32, lambda o, x: o.narrow(x, 1, 0, 3, 0), "step must not be 0"),
    ("narrow", F32, lambda o, x: o.narrow(x, 1, 0, 3, 2), "leave axis"),
    ("narrow", F32, lambda o, x: o.narrow(x, 1, 1, 3, -1), "leave axis"),
    ("tril", F32, lambda o, x: o.tril(o.reshape(x, (8,))), "at least 2"),
    ("triu", F32, lambda o, x: o.triu(x, 1.5), "diagonal"),
    ("one_hot", F32, lambda o, x: o.one_hot(x, 4), "integer tensor"),
    ("one_hot", I32, lambda o, x: o.one_hot(x, 0), "num_classes"),
]


@pytest.mark.parametrize(
    ("op", "dtype", "call", "message"),
    BAD_CALLS,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)],
)
async def test_bad_arguments_are_refused_before_allocating(
    backend: ComputeBackend, op: str, dtype: DType, call: Any, message: str
) -> None:
    require_op(backend, op)
    require_dtype(backend, dtype)
    x = backend.tensor_factory.ones((2, 4), dtype)
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(AccelError, match=message):
        call(backend.tensor_ops, x)
    assert backend.memory_manager.memory_info().used == used


async def test_edge_modes_refuse_an_empty_axis(backend: ComputeBackend) -> None:
    require_op(backend, "pad")
    x = backend.tensor_factory.zeros((0, 3))
    with pytest.raises(InvalidArgumentError, match="empty"):
        backend.tensor_ops.pad(x, 1, "reflect")
    got = await fetch(backend.tensor_ops.pad(x, 1))
    np.testing.assert_array_equal(got, np.zeros((2, 5), np.float32))
