"""Image operations, written once as compositions of other TensorOps.

Images are [N, C, H, W] (4-d) or [H, W, C] (3-d); results keep the layout. Integer images (U8
above all) are computed in F32 and rounded (half to even) and clipped back to ``0..max`` (255 for
U8); float images are taken to lie in [0, 1], and ops that brighten or sharpen clip to that range
(as torchvision does). Filters replicate the border pixels rather than padding with zeros, so
edges neither darken nor show false gradients. A backend may override any method with a fused
kernel; the composition is the reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from accelkit._core.validation import check_float_param, check_int, check_tensor
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

__all__ = ["ImageOps"]

_GRAY = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma
_MAX_TAPS = 8191  # a filter larger than any image we expect (and than a device's local memory)


class ImageOps(OpsBase[TensorKernels]):
    # These methods are compositions of the other TensorOps parts, which the final class provides.
    # -- layout helpers ---------------------------------------------------------------------------
    def _check_image(self, img: Tensor, op: str) -> DType:
        """Validate; return the compute dtype (F64 for F64 images, F32 for the rest)."""
        check_tensor(self.backend, img, "img")
        if img.ndim not in (3, 4):
            raise InvalidArgumentError(
                f"{op}: img must be [N, C, H, W] or [H, W, C]; got shape {img.shape}"
            )
        if img.dtype is DType.BOOL:
            raise InvalidArgumentError(f"{op}: img is bool; cast it to u8 or a float dtype first")
        return DType.F64 if img.dtype is DType.F64 else DType.F32

    def _fused(self, img: Tensor, kernel: str) -> bool:
        """Whether the backend's optional ``kernel`` takes this (already checked) image whole:
        fused kernels take NCHW; [H, W, C] images go through the composition."""
        return img.ndim == 4 and self.kernels.overrides(kernel)

    def _image(self, img: Tensor, op: str) -> tuple[Tensor, bool, DType]:
        """Validate, and return (float NCHW tensor, was_hwc, compute dtype)."""
        work = self._check_image(img, op)
        x = img if img.dtype is work else self.cast(img, work)  # type: ignore[attr-defined]
        hwc = img.ndim == 3
        if hwc:
            h, w, c = img.shape
            x = self.reshape(self.permute(x, (2, 0, 1)), (1, c, h, w))  # type: ignore[attr-defined]
        return x, hwc, work

    def _restore(self, y: Tensor, hwc: bool, dtype: DType, clip: bool) -> Tensor:
        ops = self
        saturated = None
        if clip or not dtype.is_floating:
            hi = _max_value(dtype)
            top = float(hi)
            if not dtype.is_floating:
                y = ops.round(y)  # type: ignore[attr-defined]
                work = y.dtype.to_numpy()
                if float(np.array(hi, work)) > hi:
                    # The white of I32/U32/I64/U64 is no value of the float it is computed in
                    # (I32's rounds up to 2**31, out of range: the cast made the brightest
                    # pixels 0). Clip to the largest value below it; what reached it is white.
                    saturated = ops.ge(y, top)  # type: ignore[attr-defined]
                    top = float(np.nextafter(np.array(hi, work), work.type(0)))
            y = ops.minimum(ops.maximum(y, 0.0), top)  # type: ignore[attr-defined]
        if hwc:
            _, c, h, w = y.shape
            y = ops.permute(ops.reshape(y, (c, h, w)), (1, 2, 0))  # type: ignore[attr-defined]
            if saturated is not None:
                saturated = ops.permute(ops.reshape(saturated, (c, h, w)), (1, 2, 0))  # type: ignore[attr-defined]
        y = y if y.dtype is dtype else ops.cast(y, dtype)  # type: ignore[attr-defined]
        if saturated is not None:
            y = ops.where(saturated, _max_value(dtype), y)  # type: ignore[attr-defined]
        return y

    def _const(self, array: np.ndarray[Any, Any], dtype: DType) -> Tensor:
        return self.backend.tensor_factory.from_host(array, dtype=dtype)

    def _pad_replicate(self, x: Tensor, ph: int, pw: int) -> Tensor:
        ops = self
        _, _, h, w = x.shape
        if ph:
            top = ops.narrow(x, 2, 0, 1)  # type: ignore[attr-defined]
            bottom = ops.narrow(x, 2, h - 1, 1)  # type: ignore[attr-defined]
            x = ops.concat([top] * ph + [x] + [bottom] * ph, 2)  # type: ignore[attr-defined]
        if pw:
            left = ops.narrow(x, 3, 0, 1)  # type: ignore[attr-defined]
            right = ops.narrow(x, 3, w - 1, 1)  # type: ignore[attr-defined]
            x = ops.concat([left] * pw + [x] + [right] * pw, 3)  # type: ignore[attr-defined]
        return x

    def _depthwise(self, x: Tensor, kernel: np.ndarray[Any, Any], work: DType) -> Tensor:
        """Apply the same 2-d ``kernel`` (odd sizes) to every channel of the NCHW float ``x``,
        with replicated borders. A backend's ``TensorKernels.depthwise`` runs it where the backend
        has one (one fused kernel speeds up every filter); the composition below is the
        reference."""
        kernels = self.kernels
        if kernels.has_depthwise:
            out = self._empty(x.shape, work)
            kernels.depthwise(x, kernel.astype(work.to_numpy()), out)
            return out
        c = x.shape[1]
        kh, kw = kernel.shape
        w = self._const(np.broadcast_to(kernel, (c, 1, kh, kw)).copy(), work)
        padded = self._pad_replicate(x, kh // 2, kw // 2)
        return self.conv2d(padded, w, groups=c)  # type: ignore[attr-defined,no-any-return]

    # -- the operations ---------------------------------------------------------------------------
    def gaussian_blur(
        self, img: Tensor, sigma: float = 1.0, kernel_size: int | None = None
    ) -> Tensor:
        """Gaussian blur (separable); ``kernel_size`` defaults to ``2 * ceil(3 sigma) + 1``."""
        sigma = check_float_param(sigma, "sigma", positive=True, finite=True)
        if kernel_size is None and sigma > _MAX_TAPS / 6:
            raise InvalidArgumentError(
                f"gaussian_blur: sigma {sigma} needs a kernel of more than {_MAX_TAPS} taps;"
                " pass a smaller sigma, or kernel_size"
            )
        ks = (
            2 * math.ceil(3 * sigma) + 1
            if kernel_size is None
            else check_int(kernel_size, "kernel_size", minimum=1)
        )
        if ks % 2 == 0:
            raise InvalidArgumentError(f"gaussian_blur: kernel_size must be odd; got {ks}")
        if ks > _MAX_TAPS:
            raise InvalidArgumentError(
                f"gaussian_blur: kernel_size {ks} is more than {_MAX_TAPS} taps"
            )
        r = np.arange(ks, dtype=np.float64) - ks // 2
        g = np.exp(-(r**2) / (2 * sigma * sigma))
        g /= g.sum()
        work = self._check_image(img, "gaussian_blur")
        if self._fused(img, "separable_filter"):
            out = self._empty(img.shape, img.dtype)
            taps = g.astype(work.to_numpy())
            self.kernels.separable_filter(img, taps, taps, out)
            return out
        x, hwc, work = self._image(img, "gaussian_blur")
        y = self._depthwise(x, g[None, :], work)
        y = self._depthwise(y, g[:, None], work)
        return self._restore(y, hwc, img.dtype, clip=False)

    def sobel_edges(self, img: Tensor) -> Tensor:
        """Per-channel gradient magnitude ``sqrt(gx^2 + gy^2)`` of the 3x3 Sobel filters.

        The result is floating (F32, or F64 for an F64 image), unclipped, in the input's layout.
        """
        work = self._check_image(img, "sobel_edges")
        if self._fused(img, "sobel_magnitude"):
            out = self._empty(img.shape, work)
            self.kernels.sobel_magnitude(img, out)
            return out
        x, hwc, work = self._image(img, "sobel_edges")
        kx = np.array([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
        gx = self._depthwise(x, kx, work)
        gy = self._depthwise(x, kx.T.copy(), work)
        ops = self
        mag = ops.sqrt(ops.add(ops.mul(gx, gx), ops.mul(gy, gy)))  # type: ignore[attr-defined]
        return self._restore(mag, hwc, work, clip=False)

    def grayscale(self, img: Tensor) -> Tensor:
        """Luma (BT.601: 0.299 R + 0.587 G + 0.114 B) of an RGB or RGBA image; one channel."""
        check_tensor(self.backend, img, "img")
        if img.ndim in (3, 4):
            # Checked before _image, which allocates a converted copy: a refusal allocates nothing.
            c = img.shape[-1] if img.ndim == 3 else img.shape[1]
            if c not in (3, 4):
                raise InvalidArgumentError(
                    f"grayscale: img must have 3 (RGB) or 4 (RGBA) channels; got {c}"
                )
        self._check_image(img, "grayscale")
        if self._fused(img, "grayscale"):
            n, _, h, wd = img.shape
            out = self._empty((n, 1, h, wd), img.dtype)
            self.kernels.grayscale(img, np.array(_GRAY), out)
            return out
        x, hwc, work = self._image(img, "grayscale")
        c = x.shape[1]
        w = np.zeros((1, c, 1, 1))
        w[0, :3, 0, 0] = _GRAY
        y = self.conv2d(x, self._const(w, work))  # type: ignore[attr-defined]
        return self._restore(y, hwc, img.dtype, clip=False)

    def threshold(self, img: Tensor, thresh: float, max_value: float | None = None) -> Tensor:
        """``max_value`` where ``img > thresh``, else 0 (``max_value`` defaults to the dtype's
        white: 255 for U8, 1.0 for floats)."""
        check_tensor(self.backend, img, "img")
        if img.dtype is DType.BOOL:  # as the other image ops (NumPy's iinfo raised for it)
            raise InvalidArgumentError(
                "threshold: img is bool; cast it to u8 or a float dtype first"
            )
        t = check_float_param(thresh, "thresh")
        hi = (
            float(_max_value(img.dtype))
            if max_value is None
            else check_float_param(max_value, "max_value")
        )
        ops = self
        mask = ops.cast(ops.gt(img, t), img.dtype)  # type: ignore[attr-defined]
        if not img.dtype.is_floating:
            return ops.mul(mask, round(hi))  # type: ignore[attr-defined,no-any-return]
        return ops.mul(mask, hi)  # type: ignore[attr-defined,no-any-return]

    def brightness(self, img: Tensor, factor: float) -> Tensor:
        """Scale intensities by ``factor`` (0 gives black, 1 the image), clipped."""
        f = check_float_param(factor, "factor")
        if f < 0:
            raise InvalidArgumentError(f"brightness: factor must be >= 0; got {f}")
        x, hwc, _ = self._image(img, "brightness")
        return self._restore(self.mul(x, f), hwc, img.dtype, clip=True)  # type: ignore[attr-defined]

    def contrast(self, img: Tensor, factor: float) -> Tensor:
        """Blend with the image's mean luma: ``(img - mean) * factor + mean``, clipped."""
        f = check_float_param(factor, "factor")
        if f < 0:
            raise InvalidArgumentError(f"contrast: factor must be >= 0; got {f}")
        x, hwc, work = self._image(img, "contrast")
        ops = self
        c = x.shape[1]
        if c in (3, 4):
            w = np.zeros((1, c, 1, 1))
            w[0, :3, 0, 0] = _GRAY
            luma = ops.conv2d(x, self._const(w, work))  # type: ignore[attr-defined]
        else:
            luma = ops.mean(x, axis=1, keepdims=True)  # type: ignore[attr-defined]
        mean = ops.mean(luma, axis=(1, 2, 3), keepdims=True)  # type: ignore[attr-defined]
        y = ops.add(ops.mul(ops.sub(x, mean), f), mean)  # type: ignore[attr-defined]
        return self._restore(y, hwc, img.dtype, clip=True)

    def invert_colors(self, img: Tensor) -> Tensor:
        """``white - img`` (255 for U8, the dtype's maximum for other integers, 1.0 for floats)."""
        check_tensor(self.backend, img, "img")
        if img.dtype is DType.BOOL:
            raise InvalidArgumentError("invert_colors: img is bool; cast it first")
        hi = _max_value(img.dtype)
        return self.sub(hi, img)  # type: ignore[attr-defined,no-any-return]

    def sharpen(self, img: Tensor, amount: float = 1.0) -> Tensor:
        """3x3 sharpening: centre ``1 + 4 amount``, edge neighbours ``-amount``; clipped."""
        a = check_float_param(amount, "amount")
        x, hwc, work = self._image(img, "sharpen")
        k = np.array([[0.0, -a, 0.0], [-a, 1 + 4 * a, -a], [0.0, -a, 0.0]])
        return self._restore(self._depthwise(x, k, work), hwc, img.dtype, clip=True)


def _max_value(dtype: DType) -> int | float:
    if dtype.is_floating:
        return 1.0
    if dtype is DType.U8:
        return 255
    return int(np.iinfo(dtype.to_numpy()).max)
