"""The CPU backend's host kernels where a fast path must agree with the contract: float to
integer casts (C semantics: truncation, NaN and out-of-range values to 0) and the depthwise
filter."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from accelkit._core.host_kernels.image import (
    depthwise_replicate,
    grayscale,
    separable_filter,
    sobel_magnitude,
)
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


def _textbook(x: np.ndarray[Any, Any], k: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Correlation with replicated borders, tap by tap in float64."""
    kh, kw = k.shape
    h, w = x.shape[2:]
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (kh // 2,) * 2, (kw // 2,) * 2), mode="edge")
    out: np.ndarray[Any, Any] = sum(
        k[i, j] * p[:, :, i : i + h, j : j + w] for i in range(kh) for j in range(kw)
    )
    return out


# Random taps, and taps that are symmetric, antisymmetric or zero in places (the kernel pairs
# those up), on planes wider than tall and the reverse (the flat layout's row wrap).
KERNELS = {
    "3x3": np.random.default_rng(2).standard_normal((3, 3)),
    "1x7": np.random.default_rng(3).standard_normal((1, 7)),
    "7x1": np.random.default_rng(4).standard_normal((7, 1)),
    "5x3-zeros": np.array([[0, 1, 0], [2, 0, -2], [0, 0, 0], [1, 3, 1], [0, -1, 0.0]]),
    "1x1": np.array([[2.5]]),
}


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("shape", [(3, 2, 17, 40), (2, 1, 40, 5), (1, 1, 1, 1)])
def test_the_depthwise_filter_is_the_textbook_correlation(
    kernel: str, shape: tuple[int, ...]
) -> None:
    x = np.random.default_rng(1).random(shape).astype(np.float32)
    k = KERNELS[kernel].astype(np.float32)
    out = np.empty_like(x)
    depthwise_replicate(x, k, out)
    np.testing.assert_allclose(out, _textbook(x, k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("col", "row"),
    [
        ([0.25, 0.5, 0.25], [0.1, 0.2, 0.4, 0.2, 0.1]),  # symmetric pairs
        ([1.0, 2.0, 1.0], [-1.0, 0.0, 1.0]),  # antisymmetric row, zero centre
        ([0.3, -0.7, 1.9], [1.0]),  # no symmetry; a 1-tap row
    ],
)
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64])
def test_the_separable_filter_is_the_outer_product_correlation(
    col: list[float], row: list[float], dtype: Any
) -> None:
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (2, 3, 13, 21)).astype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    out = np.empty_like(x)
    separable_filter(x, np.array(col, ct), np.array(row, ct), out)
    want = _textbook(x, np.outer(col, row))
    if np.dtype(dtype).kind in "iu":  # rounded half to even, clipped to 0..max
        want = np.clip(np.rint(want), 0, 255 if dtype == np.uint8 else np.iinfo(dtype).max)
        assert np.abs(out.astype(np.float64) - want).max() <= 1
        assert (out == want).mean() > 0.95  # taps in tenths: many sums land on .5
    else:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_sobel_magnitude_and_grayscale_are_their_formulas(dtype: Any) -> None:
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (2, 3, 11, 19)).astype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    kx = np.array([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])
    mag = np.empty(x.shape, ct)
    sobel_magnitude(x, mag)
    want = np.sqrt(_textbook(x, kx) ** 2 + _textbook(x, kx.T) ** 2)
    np.testing.assert_allclose(mag, want, rtol=1e-5, atol=1e-3)

    gray = np.empty((2, 1, 11, 19), dtype)
    grayscale(x, np.array([0.299, 0.587, 0.114]), gray)
    luma = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).astype(np.float64)[:, None]
    if dtype == np.uint8:
        luma = np.clip(np.rint(luma), 0, 255)
        assert np.abs(gray.astype(np.float64) - luma).max() <= 1
    else:
        np.testing.assert_allclose(gray, luma, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_slices_evenly_spaced_indexes_and_gathers_the_rest(axis: int) -> None:
    """The CPU take kernel turns flips, strides and broadcasts into slices; every index form
    gives np.take's result."""
    from accelkit._core.host_kernels.elementwise import take

    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    n = x.shape[axis]
    forms: list[Any] = [np.arange(n)[::-1], np.arange(0, n, 2), np.zeros(4, np.int64),
                        [n - 1, 0, 1], [1]]  # fmt: skip
    forms += [
        range(n - 1, -1, -1),
        range(n - 1, -1, -2),
        range(1, n, 2),
        range(2, 2 + 2**70, 2**70),
    ]
    for form in forms:
        index = form if isinstance(form, range) else np.asarray(form, np.int64)
        shape = list(x.shape)
        shape[axis] = len(index)
        out = np.empty(shape, x.dtype)
        take(x, axis, index, out)
        want = np.take(x, np.asarray(index, np.int64), axis)
        np.testing.assert_array_equal(out, want, err_msg=str(index))
