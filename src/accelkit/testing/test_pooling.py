"""Pooling and the other convolutions: max_pool2d, avg_pool2d (ceil mode, count_include_pad),
adaptive_avg_pool2d, conv1d, conv_transpose2d and conv2d's per-side padding, against the
loop-by-loop definitions in :mod:`accelkit.testing.reference`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType
from accelkit.errors import AccelError
from accelkit.ops._mixins.pooling import pool_output_size

from . import reference as ref
from .checks import ALL_DTYPES, assert_close, fetch, ids, require_dtype, require_op, sample

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

FLOATS = [DType.F32, DType.F64, DType.F16, DType.BF16]


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


AVG_CASES: list[tuple[Any, Any, Any, bool, bool]] = [
    (3, 2, 1, False, True), (3, 2, 1, True, True), (3, 2, 1, True, False), (2, None, 0, True, True),
    ((3, 2), (2, 3), (1, 0), True, False), (1, 1, 0, False, True),
]  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_avg_pool2d(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "avg_pool2d")
    require_dtype(backend, dtype)
    x_h = sample((2, 3, 11, 9), dtype, seed=21)
    x = backend.tensor_factory.from_host(x_h)
    for k, s, p, ceil, include in AVG_CASES:
        kk, pp = _pair(k), _pair(p)
        ss = kk if s is None else _pair(s)
        oh = pool_output_size(11, kk[0], ss[0], pp[0], 1, ceil)
        ow = pool_output_size(9, kk[1], ss[1], pp[1], 1, ceil)
        got = await fetch(backend.tensor_ops.avg_pool2d(x, k, s, p, ceil, include), dtype)
        want = ref.avg_pool2d(x_h, kk, ss, pp, oh, ow, include)
        assert_close(got, want, dtype, scale=2.0)


MAX_CASES: list[tuple[Any, Any, Any, Any, bool]] = [
    (3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, None, 0, 1, True), (3, 1, 1, 2, False),
    ((2, 3), (2, 1), (1, 1), (2, 1), True),
]  # fmt: skip
MAX_DTYPES: list[DType] = [d for d in ALL_DTYPES if d is not DType.BOOL]


@pytest.mark.parametrize("dtype", MAX_DTYPES, ids=ids(MAX_DTYPES))
async def test_max_pool2d(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "max_pool2d")
    require_dtype(backend, dtype)
    x_h = sample((2, 2, 10, 7), dtype, low=-100, high=100, seed=22)
    x = backend.tensor_factory.from_host(x_h)
    for k, s, p, d, ceil in MAX_CASES:
        kk, pp, dd = _pair(k), _pair(p), _pair(d)
        ss = kk if s is None else _pair(s)
        oh = pool_output_size(10, kk[0], ss[0], pp[0], dd[0], ceil)
        ow = pool_output_size(7, kk[1], ss[1], pp[1], dd[1], ceil)
        got = await fetch(backend.tensor_ops.max_pool2d(x, k, s, p, d, ceil), dtype)
        np.testing.assert_array_equal(got, ref.max_pool2d(x_h, kk, ss, pp, dd, oh, ow))


async def test_pooling_keeps_nan_in_its_own_windows(backend: ComputeBackend) -> None:
    require_op(backend, "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")
    x_h = sample((1, 1, 6, 6), DType.F32, seed=23)
    x_h[0, 0, 1, 1] = np.nan
    x = backend.tensor_factory.from_host(x_h)
    ops = backend.tensor_ops
    cases = (
        (ops.max_pool2d(x, 2), ref.max_pool2d(x_h, (2, 2), (2, 2), (0, 0), (1, 1), 3, 3)),
        (ops.avg_pool2d(x, 2), ref.avg_pool2d(x_h, (2, 2), (2, 2), (0, 0), 3, 3, True)),
        (ops.adaptive_avg_pool2d(x, (4, 4)), ref.adaptive_avg_pool2d(x_h, 4, 4)),
    )
    for got, want in cases:
        nan = np.isnan(want)
        assert nan.any()
        assert not nan.all()
        np.testing.assert_array_equal(np.isnan(await fetch(got)), nan)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_adaptive_avg_pool2d(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "adaptive_avg_pool2d")
    require_dtype(backend, dtype)
    x_h = sample((2, 3, 11, 9), dtype, seed=24)
    x = backend.tensor_factory.from_host(x_h)
    for size, (oh, ow) in (((3, 3), (3, 3)), ((4, 5), (4, 5)), (1, (1, 1)), ((None, 2), (11, 2)),
                           ((11, 9), (11, 9)), ((5, 7), (5, 7))):  # fmt: skip
        got = await fetch(backend.tensor_ops.adaptive_avg_pool2d(x, size), dtype)
        assert_close(got, ref.adaptive_avg_pool2d(x_h, oh, ow), dtype, scale=2.0)


async def test_pooling_of_no_channels_is_empty(backend: ComputeBackend) -> None:
    """[N, 0, H, W] pools to [N, 0, oh, ow], as max pooling did (average pooling raised
    "groups must be >= 1", an argument the caller never gave)."""
    x = backend.tensor_factory.from_host(np.zeros((2, 0, 4, 4), np.float32))
    ops = backend.tensor_ops
    for name, got in (
        ("max_pool2d", ops.max_pool2d(x, 2)),
        ("avg_pool2d", ops.avg_pool2d(x, 2)),
        ("adaptive_avg_pool2d", ops.adaptive_avg_pool2d(x, 2)),
        ("adaptive_avg_pool2d uneven", ops.adaptive_avg_pool2d(x, 3)),
    ):
        out = await fetch(got)
        assert out.shape == ((2, 0, 3, 3) if "uneven" in name else (2, 0, 2, 2)), name


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
async def test_conv1d(backend: ComputeBackend, dtype: DType) -> None:
    require_op(backend, "conv1d")
    require_dtype(backend, dtype)
    x_h = sample((2, 4, 20), dtype, seed=25)
    w_h = sample((6, 2, 3), dtype, seed=26)
    b_h = sample((6,), dtype, seed=27)
    f = backend.tensor_factory
    got = await fetch(
        backend.tensor_ops.conv1d(
            f.from_host(x_h), f.from_host(w_h), f.from_host(b_h), stride=2, padding=(1, 2),
            dilation=2, groups=2,
        ),
        dtype,
    )  # fmt: skip
    padded = np.pad(x_h, [(0, 0), (0, 0), (1, 2)])
    want = ref.conv2d(padded[:, :, None, :], w_h[:, :, None, :], b_h, (1, 2), (0, 0), (1, 2), 2)
    assert_close(got, want[:, :, 0, :], dtype, scale=4.0)


async def test_conv2d_with_padding_per_side(backend: ComputeBackend) -> None:
    require_op(backend, "conv2d")
    x_h = sample((2, 3, 8, 7), DType.F32, seed=28)
    w_h = sample((4, 3, 3, 2), DType.F32, seed=29)
    f = backend.tensor_factory
    got = await fetch(
        backend.tensor_ops.conv2d(
            f.from_host(x_h), f.from_host(w_h), padding=((1, 0), (2, 1)), stride=2
        )
    )
    padded = np.pad(x_h, [(0, 0), (0, 0), (1, 0), (2, 1)])
    assert_close(got, ref.conv2d(padded, w_h, None, (2, 2)), DType.F32, scale=4.0)


CONVT_CASES: list[tuple[Any, Any, Any, int, Any]] = [
    (1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (3, (1, 2), (2, 0), 2, 1), (2, 0, 1, 1, 2),
    ((2, 1), 1, (1, 0), 4, (1, 2)),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(CONVT_CASES)))
async def test_conv_transpose2d(backend: ComputeBackend, case: int) -> None:
    require_op(backend, "conv_transpose2d")
    stride, padding, output_padding, groups, dilation = CONVT_CASES[case]
    x_h = sample((2, 4, 5, 6), DType.F32, seed=30 + case)
    w_h = sample((4, 6 // groups if groups != 4 else 2, 3, 3), DType.F32, seed=40 + case)
    b_h = sample((w_h.shape[1] * groups,), DType.F32, seed=50 + case)
    f = backend.tensor_factory
    got = await fetch(
        backend.tensor_ops.conv_transpose2d(
            f.from_host(x_h), f.from_host(w_h), f.from_host(b_h), stride=stride, padding=padding,
            output_padding=output_padding, groups=groups, dilation=dilation,
        )
    )  # fmt: skip
    want = ref.conv_transpose2d(
        x_h, w_h, b_h, _pair(stride), _pair(padding), _pair(output_padding), groups,
        _pair(dilation),
    )  # fmt: skip
    assert_close(got, want, DType.F32, scale=4.0)


BAD_CALLS: list[tuple[str, Any, str]] = [
    ("avg_pool2d", lambda o, t: o.avg_pool2d(t["x"], 3, padding=2), "at most half"),
    ("avg_pool2d", lambda o, t: o.avg_pool2d(t["x3"], 2), r"\[N, C, H, W\]"),
    ("avg_pool2d", lambda o, t: o.avg_pool2d(t["x"], 9), "does not fit"),
    ("avg_pool2d", lambda o, t: o.avg_pool2d(t["x"], 2, ceil_mode=1), "must be a bool"),
    ("max_pool2d", lambda o, t: o.max_pool2d(t["x"], 0), "kernel_size"),
    ("max_pool2d", lambda o, t: o.max_pool2d(t["flags"], 2), "bool"),
    ("adaptive_avg_pool2d", lambda o, t: o.adaptive_avg_pool2d(t["x"], 0), "output_size"),
    ("adaptive_avg_pool2d", lambda o, t: o.adaptive_avg_pool2d(t["x"], (1, 2, 3)), "pair"),
    ("conv1d", lambda o, t: o.conv1d(t["x"], t["x"]), r"\[N, C, L\]"),
    ("conv2d", lambda o, t: o.conv2d(t["x"], t["w"], padding=((1, -1), (0, 0))), "padding"),
    ("conv_transpose2d", lambda o, t: o.conv_transpose2d(t["x"], t["w3"]), "input channels"),
    ("conv_transpose2d", lambda o, t: o.conv_transpose2d(t["x"], t["w"], output_padding=1),
     "output_padding"),
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
        "x": f.ones((1, 4, 8, 8)), "x3": f.ones((4, 8, 8)), "flags": f.ones((1, 1, 4, 4), "bool"),
        "w": f.ones((4, 2, 3, 3)), "w3": f.ones((3, 2, 3, 3)),
    }  # fmt: skip
    await backend.synchronize()
    used = backend.memory_manager.memory_info().used
    with pytest.raises(AccelError, match=message):
        call(backend.tensor_ops, inputs)
    assert backend.memory_manager.memory_info().used == used
