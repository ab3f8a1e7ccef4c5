"""The CPU backend's host kernels where a fast path must agree with the plain one: float to
integer casts (C semantics: truncation, NaN and out-of-range values to 0) and the depthwise filter
split between threads."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from accelkit.backends.cpu.numpy_nn import _depthwise_slice, depthwise_replicate
from accelkit.sdk import host_cast_into

Array = np.ndarray[Any, Any]

SPECIAL = np.array(
    [
        0, 0.5, 1.9, -0.9, -1.0, 127.9, 128.0, -128.9, -129.0, 254.99, 255.0, 255.5, 256.0,
        300.0, -300.0, 32767.5, 32768.0, -32768.9, -32769.0, 65535.9, 65536.0, 2.0**31,
        -(2.0**31), 2.0**31 - 1, 2.0**32, 2.0**63, np.nan, np.inf, -np.inf,
    ],
    np.float64,
)  # fmt: skip


def reference_cast(x: Array, dtype: Any) -> Array:
    """Truncate in float64, out-of-range and non-finite values to 0: the contract, spelt out."""
    info = np.iinfo(dtype)
    t = np.trunc(x.astype(np.float64))
    ok = np.isfinite(t) & (t >= info.min) & (t < info.max + 1.0)
    return np.where(ok, t, 0).astype(dtype)


@pytest.mark.parametrize("source", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "target", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64]
)
def test_float_to_int_casts_follow_c_semantics(source: Any, target: Any) -> None:
    with np.errstate(over="ignore"):
        x = SPECIAL.astype(source)  # values a narrow source cannot hold become inf
    out = np.empty(x.shape, target)
    host_cast_into(x, out)
    np.testing.assert_array_equal(out, reference_cast(x, target))


def test_a_large_cast_agrees_with_the_contract() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1 << 18) * 200).astype(np.float32)
    x[::997] = np.nan
    out = np.empty(x.shape, np.uint8)
    host_cast_into(x, out)
    np.testing.assert_array_equal(out, reference_cast(x, np.uint8))


@pytest.mark.parametrize("kernel", ["3x3", "1x7", "7x1"])
def test_the_threaded_depthwise_filter_equals_the_serial_one(kernel: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.random((8, 2, 96, 96)).astype(np.float32)  # above the threading threshold
    kh, kw = {"3x3": (3, 3), "1x7": (1, 7), "7x1": (7, 1)}[kernel]
    k = rng.standard_normal((kh, kw)).astype(np.float32)
    threaded, serial = np.empty_like(x), np.empty_like(x)
    depthwise_replicate(x, k, threaded)
    _depthwise_slice(x, k, serial)
    np.testing.assert_array_equal(threaded, serial)
    # And both are the textbook correlation with replicated borders.
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (kh // 2,) * 2, (kw // 2,) * 2), mode="edge")
    want = sum(k[i, j] * p[:, :, i : i + 96, j : j + 96] for i in range(kh) for j in range(kw))
    np.testing.assert_allclose(threaded, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["gelu_tanh", "silu", "sigmoid", "exp", "tanh", "gelu", "rsqrt"])
def test_a_split_elementwise_kernel_equals_the_serial_one(op: str) -> None:
    from accelkit.backends.cpu import parallel
    from accelkit.backends.cpu.numpy_elementwise import _unary_float, unary

    x = np.random.default_rng(2).standard_normal((3, parallel.MIN_ELEMENTS)).astype(np.float32)
    if op == "rsqrt":
        x = (np.abs(x) + 0.1).astype(np.float32)
    split, serial = np.empty_like(x), np.empty_like(x)
    unary(op, x, split)
    with np.errstate(all="ignore"):
        _unary_float(op, x, serial)
    np.testing.assert_array_equal(split, serial)
    # A non-contiguous output is written in place, not through a copy.
    wide = np.zeros((3, 2 * parallel.MIN_ELEMENTS), np.float32)
    unary(op, x, wide[:, ::2])
    np.testing.assert_array_equal(wide[:, ::2], serial)
    assert not wide[:, 1::2].any()


def test_a_split_layer_norm_matches_the_float64_formula() -> None:
    from accelkit.backends.cpu import parallel
    from accelkit.backends.cpu.numpy_nn import layer_norm

    rng = np.random.default_rng(3)
    rows, d = 2 * parallel.MIN_ELEMENTS // 256, 256
    x = (rng.standard_normal((rows, d)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    out = np.empty_like(x)
    layer_norm(x, w, b, 1e-5, out)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    strided = np.zeros((rows, 2 * d), np.float32)
    layer_norm(x, w, b, 1e-5, strided[:, ::2])
    np.testing.assert_array_equal(strided[:, ::2], out)


@pytest.mark.anyio
@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
async def test_a_split_binary_op_equals_numpy(backend: Any, op: str) -> None:
    from accelkit.backends.cpu import parallel

    rng = np.random.default_rng(4)
    a_h = rng.standard_normal((3, parallel.MIN_ELEMENTS)).astype(np.float32)
    b_h = rng.standard_normal((3, parallel.MIN_ELEMENTS)).astype(np.float32)
    f = backend.tensor_factory
    other = backend.create_stream()
    with backend.use_stream(other):  # an input written on another stream: ordered after it
        a = backend.tensor_ops.mul(f.from_host(a_h), 1.0)
    got = await getattr(backend.tensor_ops, op)(a, f.from_host(b_h)).to_host()
    want = {"add": np.add, "sub": np.subtract, "mul": np.multiply}.get(op) or getattr(np, op)
    np.testing.assert_array_equal(got, want(a_h, b_h))
