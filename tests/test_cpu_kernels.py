"""The CPU backend's host kernels where a fast path must agree with the contract: float to
integer casts (C semantics: truncation, NaN and out-of-range values to 0) and the depthwise
filter."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from accelkit.backends.cpu.numpy_nn import depthwise_replicate
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
def test_the_depthwise_filter_is_the_textbook_correlation(kernel: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.random((8, 2, 96, 96)).astype(np.float32)
    kh, kw = {"3x3": (3, 3), "1x7": (1, 7), "7x1": (7, 1)}[kernel]
    k = rng.standard_normal((kh, kw)).astype(np.float32)
    out = np.empty_like(x)
    depthwise_replicate(x, k, out)
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (kh // 2,) * 2, (kw // 2,) * 2), mode="edge")
    want = sum(k[i, j] * p[:, :, i : i + 96, j : j + 96] for i in range(kh) for j in range(kw))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
