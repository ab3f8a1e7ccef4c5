"""Image ops against explicit per-pixel formulas with replicated borders, on [N, C, H, W] and
[H, W, C] images, for float images in [0, 1] and U8 images (rounded half to even, clipped)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from accelkit import ComputeBackend, DType, InvalidArgumentError

from . import reference as ref
from .checks import assert_close, f64, fetch, require_dtype

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]

DTYPES = [DType.F32, DType.F64, DType.U8, DType.F16, DType.BF16]
LAYOUTS = {"nchw": (2, 3, 6, 7), "hwc": (6, 7, 3)}


def _image(shape: tuple[int, ...], dtype: DType, seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if dtype is DType.U8:
        return rng.integers(0, 256, size=shape).astype(np.uint8)
    return rng.random(shape).astype(dtype.to_numpy())


def _check(
    got: np.ndarray[Any, Any],
    expected: np.ndarray[Any, Any],
    dtype: DType,
    scale: float = 4.0,
) -> None:
    """Integer images may differ by one where float rounding lands on .5; floats by tolerance."""
    assert got.shape == expected.shape, f"shape {got.shape} != expected {expected.shape}"
    if dtype.is_floating:
        assert_close(got, expected, dtype, scale=scale)
        return
    diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= 1, f"max difference {diff.max()} > 1"
    assert (diff == 0).mean() > 0.95, "more than 5% of the pixels are off by one"


def _params(*names: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        ("layout", "dtype"),
        [(lay, dt) for lay in LAYOUTS for dt in DTYPES if not names or dt.value in names],
        ids=[
            f"{lay}-{dt.value}"
            for lay in LAYOUTS
            for dt in DTYPES
            if not names or dt.value in names
        ],
    )


@_params()
@pytest.mark.parametrize(("sigma", "size"), [(1.0, None), (0.8, 3), (0.5, 5)])
async def test_gaussian_blur(
    backend: ComputeBackend, layout: str, dtype: DType, sigma: float, size: int | None
) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=1)
    y = backend.tensor_ops.gaussian_blur(backend.tensor_factory.from_host(img), sigma, size)
    _check(await fetch(y, dtype), ref.gaussian_blur(img, sigma, size), dtype)


async def test_gaussian_blur_keeps_a_constant_image(backend: ComputeBackend) -> None:
    """Replicated borders: a flat image stays flat up to the edges (zero padding would darken)."""
    img = np.full((1, 1, 5, 6), 0.5, np.float32)
    y = backend.tensor_ops.gaussian_blur(backend.tensor_factory.from_host(img), 2.0)
    assert_close(await fetch(y), img, DType.F32)


@_params()
async def test_sobel_edges(backend: ComputeBackend, layout: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=2)
    y = backend.tensor_ops.sobel_edges(backend.tensor_factory.from_host(img))
    out_dt = DType.F64 if dtype is DType.F64 else DType.F32
    expected = ref.sobel_edges(img)
    if dtype in (DType.F16, DType.BF16):
        assert_close(await fetch(y, out_dt), expected, dtype, scale=4.0)
    else:
        assert_close(await fetch(y, out_dt), expected, out_dt, scale=10.0)


async def test_sobel_edges_of_a_ramp_and_of_a_flat_image(backend: ComputeBackend) -> None:
    ramp = np.tile(np.arange(6, dtype=np.float64), (5, 1))[None, None]  # d/dx = 1 per pixel
    got = await fetch(
        backend.tensor_ops.sobel_edges(backend.tensor_factory.from_host(ramp)), DType.F64
    )
    # Interior: gx = 8 (the Sobel weights sum to 4 on each side, times a step of 2), gy = 0.
    np.testing.assert_allclose(got[0, 0, :, 1:-1], 8.0)
    # Replicated borders: the one-sided difference at the edges is half as large.
    np.testing.assert_allclose(got[0, 0, :, 0], 4.0)
    flat = np.full((4, 4, 3), 0.3, np.float32)
    got = await fetch(
        backend.tensor_ops.sobel_edges(backend.tensor_factory.from_host(flat)), DType.F32
    )
    np.testing.assert_allclose(got, 0.0, atol=1e-6)


@_params()
@pytest.mark.parametrize("channels", [3, 4])
async def test_grayscale(backend: ComputeBackend, layout: str, dtype: DType, channels: int) -> None:
    require_dtype(backend, dtype)
    shape = list(LAYOUTS[layout])
    shape[1 if layout == "nchw" else 2] = channels
    img = _image(tuple(shape), dtype, seed=3)
    y = backend.tensor_ops.grayscale(backend.tensor_factory.from_host(img))
    expected = ref.grayscale(img)
    assert y.shape == expected.shape
    _check(await fetch(y, dtype), expected, dtype)


@_params()
async def test_threshold(backend: ComputeBackend, layout: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=4)
    f, ops = backend.tensor_factory, backend.tensor_ops
    t = 100 if dtype is DType.U8 else 0.4
    white = 255 if dtype is DType.U8 else 1.0
    x = f.from_host(img)
    _check(await fetch(ops.threshold(x, t), dtype), ref.threshold(img, t, white), dtype)
    custom = 77 if dtype is DType.U8 else 0.25
    _check(await fetch(ops.threshold(x, t, custom), dtype), ref.threshold(img, t, custom), dtype)


@_params()
@pytest.mark.parametrize("factor", [0.0, 0.5, 1.0, 1.7])
async def test_brightness(
    backend: ComputeBackend, layout: str, dtype: DType, factor: float
) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=5)
    y = backend.tensor_ops.brightness(backend.tensor_factory.from_host(img), factor)
    _check(await fetch(y, dtype), ref.brightness(img, factor), dtype)


@_params()
@pytest.mark.parametrize("factor", [0.0, 0.5, 1.5])
async def test_contrast(backend: ComputeBackend, layout: str, dtype: DType, factor: float) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=6)
    y = backend.tensor_ops.contrast(backend.tensor_factory.from_host(img), factor)
    _check(await fetch(y, dtype), ref.contrast(img, factor), dtype)


@pytest.mark.parametrize("channels", [1, 2, 4])
async def test_contrast_other_channel_counts(backend: ComputeBackend, channels: int) -> None:
    """RGBA uses the luma of RGB; other channel counts use the channel mean."""
    img = _image((2, channels, 5, 5), DType.F32, seed=7)
    y = backend.tensor_ops.contrast(backend.tensor_factory.from_host(img), 1.8)
    _check(await fetch(y, DType.F32), ref.contrast(img, 1.8), DType.F32)


@_params()
async def test_invert_colors(backend: ComputeBackend, layout: str, dtype: DType) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=8)
    y = backend.tensor_ops.invert_colors(backend.tensor_factory.from_host(img))
    _check(await fetch(y, dtype), ref.invert_colors(img), dtype, scale=1.0)


@pytest.mark.parametrize("dtype", [DType.I16, DType.U16], ids=str)
async def test_invert_colors_of_other_integers_uses_the_dtype_maximum(
    backend: ComputeBackend, dtype: DType
) -> None:
    require_dtype(backend, dtype)
    img = np.array([[[0, 5, 1000]]], dtype.to_numpy())
    y = backend.tensor_ops.invert_colors(backend.tensor_factory.from_host(img))
    np.testing.assert_array_equal(await fetch(y, dtype), ref.invert_colors(img))


@_params()
@pytest.mark.parametrize("amount", [0.0, 0.5, 1.0])
async def test_sharpen(backend: ComputeBackend, layout: str, dtype: DType, amount: float) -> None:
    require_dtype(backend, dtype)
    img = _image(LAYOUTS[layout], dtype, seed=9)
    y = backend.tensor_ops.sharpen(backend.tensor_factory.from_host(img), amount)
    _check(await fetch(y, dtype), ref.sharpen(img, amount), dtype)


@pytest.mark.parametrize("dtype", [DType.I32, DType.U32, DType.I64, DType.U64], ids=str)
@pytest.mark.parametrize("layout", ["hwc", "nchw"])
async def test_the_white_of_wide_integer_images_stays_white(
    backend: ComputeBackend, dtype: DType, layout: str
) -> None:
    """Computed in F32, I32's white rounds up to 2**31, out of its range: clipped there, the
    brightest pixels came back 0 (black) from brightness(x, 1.0), a saturating brightness and
    a sharpen of a white image."""
    require_dtype(backend, dtype)
    white = int(np.iinfo(dtype.to_numpy()).max)
    px = np.array([0, 100, white], dtype.to_numpy())
    img = px.reshape(1, 1, 3) if layout == "hwc" else px.reshape(1, 1, 1, 3)
    ops, x = backend.tensor_ops, backend.tensor_factory.from_host(img)
    np.testing.assert_array_equal(await fetch(ops.brightness(x, 1.0), dtype), img)
    saturated = img.copy()
    saturated.reshape(-1)[1:] = [300, white]
    np.testing.assert_array_equal(await fetch(ops.brightness(x, 3.0), dtype), saturated)
    flat = np.full((1, 1, 3, 3), white, dtype.to_numpy())
    got = await fetch(ops.sharpen(backend.tensor_factory.from_host(flat), 0.5), dtype)
    np.testing.assert_array_equal(got, flat)
    # grayscale and gaussian_blur of a white image (the CPU backend's fused forms wrapped it to
    # INT_MIN or 0): white, within the rounding of an F32 weighted sum (3 channels, or 2 x 5
    # taps: each term and partial sum rounded, at most 2**-24 relative each, 64 of them bound
    # the sum with room to spare), never more than white
    rgb = np.full((3, 4, 4, 3) if layout == "hwc" else (1, 3, 4, 4), white, dtype.to_numpy())
    x = backend.tensor_factory.from_host(rgb[0] if layout == "hwc" else rgb)
    slack = int(np.ceil(white * 64 * 2.0**-24))
    for name, result in (("grayscale", ops.grayscale(x)), ("gaussian_blur", ops.gaussian_blur(x))):
        values = [int(v) for v in (await fetch(result, dtype)).reshape(-1)]
        assert all(white - slack <= v <= white for v in values), (name, min(values), white)


async def test_threshold_refuses_a_bool_image(backend: ComputeBackend) -> None:
    img = backend.tensor_factory.from_host(np.zeros((2, 2, 3), bool))
    with pytest.raises(InvalidArgumentError, match="bool"):
        backend.tensor_ops.threshold(img, 0.5)


async def test_float_image_ops_that_brighten_clip_to_unit_range(backend: ComputeBackend) -> None:
    img = np.array([[[0.2, 0.9, 0.6]]], np.float32)
    ops, f = backend.tensor_ops, backend.tensor_factory
    got = await fetch(ops.brightness(f.from_host(img), 2.0))
    np.testing.assert_allclose(got, [[[0.4, 1.0, 1.0]]], rtol=1e-6)
    sharp = f64(await fetch(ops.sharpen(f.from_host(np.eye(5, dtype=np.float32)[None, None]), 2.0)))
    assert sharp.min() >= 0.0
    assert sharp.max() <= 1.0
