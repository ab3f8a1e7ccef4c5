"""NumPy bodies of the fused image kernels: filters with replicated borders, Sobel magnitude and luma.

Each works one [H, W] plane at a time (the plane and its temporaries stay in the core's cache),
on a padded copy stored row-major with the *padded* width: the pixel a tap at (i, j) reads for
output (y, x) then lies ``i * W2 + j`` elements after the one for tap (0, 0), so every tap is one
contiguous slice of the flat buffer, and NumPy runs each pass over contiguous memory. The last
``2 rw`` columns of every output row are wrapped-around garbage and are never stored. Symmetric
and antisymmetric tap pairs share one multiply, and zero taps cost nothing.

Sums run in float32 (float64 for F64 data); integer outputs are rounded half to even and clipped
to ``0..max`` as the core's image compositions do. (One thread: splitting the planes between the
cores measured slower here, the passes being memory-bound.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

__all__ = ["depthwise_replicate", "grayscale", "separable_filter", "sobel_magnitude"]


def _compute_dtype(*arrays: Array) -> np.dtype[Any]:
    if any(a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


class _Planes:
    """Scratch for planes of ``h x w`` padded by ``rh`` rows and ``rw`` columns on each side."""

    def __init__(self, h: int, w: int, rh: int, rw: int, dtype: np.dtype[Any]) -> None:
        self.h, self.w, self.rh, self.rw = h, w, rh, rw
        self.width = w + 2 * rw
        rows = h + 2 * rh
        # Slack of 2 rw at the end: a tap's slice may run past the last padded row by that much.
        self.flat = np.empty(rows * self.width + 2 * rw, dtype)
        self.grid = self.flat[: rows * self.width].reshape(rows, self.width)
        self.flat[rows * self.width :] = 0  # read only into the discarded columns

    def load(self, plane: Array) -> Array:
        """Copy ``plane`` in (converted) with its border replicated; returns the flat buffer."""
        g, h, w, rh, rw = self.grid, self.h, self.w, self.rh, self.rw
        g[rh : rh + h, rw : rw + w] = plane
        if rw:
            g[rh : rh + h, :rw] = g[rh : rh + h, rw : rw + 1]
            g[rh : rh + h, rw + w :] = g[rh : rh + h, rw + w - 1 : rw + w]
        if rh:
            g[:rh] = g[rh]
            g[rh + h :] = g[rh + h - 1]
        return self.flat


def _correlate_1d(src: Array, taps: Array, step: int, out: Array, tmp: Array) -> None:
    """``out[k] = sum_j taps[j] * src[k + j * step]`` for every k of out (taps of odd length)."""
    n, r = out.shape[0], len(taps) // 2

    def at(j: int) -> Array:
        return src[j * step : j * step + n]

    # (weight, a, b, combine): weight * combine(a, b), or weight * a where b is None
    terms: list[tuple[Any, Array, Array | None, Any]] = []
    for j in range(r):
        a, b = taps[j], taps[2 * r - j]
        if a and a == b:
            terms.append((a, at(j), at(2 * r - j), np.add))
        elif a and a == -b:
            terms.append((a, at(j), at(2 * r - j), np.subtract))
        else:
            terms += [(t, at(i), None, None) for t, i in ((a, j), (b, 2 * r - j)) if t]
    if taps[r]:
        terms.append((taps[r], at(r), None, None))
    if not terms:
        out[...] = 0
    for t, (weight, a, b, combine) in enumerate(terms):
        dest = out if t == 0 else tmp
        if b is None:
            np.multiply(a, weight, out=dest)
        else:
            combine(a, b, out=dest)
            dest *= weight
        if t:
            out += tmp


def _store(result: Array, h: int, width: int, w: int, out: Array) -> None:
    """Store the first w columns of the flat ``result`` rows into the plane ``out``."""
    full = result[: h * width]
    over = None
    if out.dtype.kind in "iu":  # rounded and clipped over the contiguous rows: faster
        over = _rounded_for(full, out.dtype)
    out[...] = full.reshape(h, width)[:, :w]
    if over is not None:
        out[over.reshape(h, width)[:, :w]] = _int_max(out.dtype)


def _int_max(dtype: np.dtype[Any]) -> int:
    return 255 if dtype == np.uint8 else int(np.iinfo(dtype).max)


def _rounded_for(acc: Array, dtype: np.dtype[Any]) -> Array | None:
    """Round the float ``acc`` in place and clip it to integer ``dtype``'s range, ready to
    cast. Where the float type rounds the dtype's maximum up (I32's 2**31 - 1 is 2**31 in F32,
    which cast back wraps to INT32_MIN: white became black), the clip stops one float below,
    and the values at or above the maximum are returned as a mask, to be set to it after the
    cast (saturation, as OpenCL's convert_sat); None where no value needs it."""
    np.rint(acc, out=acc)
    top = _int_max(dtype)
    hi = acc.dtype.type(top)
    over = None
    if float(hi) > top:
        over = acc >= hi
        hi = np.nextafter(hi, acc.dtype.type(0))
        if not over.any():
            over = None
    np.clip(acc, 0, hi, out=acc)
    return over


def separable_filter(x: Array, col: Array, row: Array, out: Array) -> None:
    """Correlate every plane of NCHW ``x`` with ``outer(col, row)`` (odd lengths), borders
    replicated: the rows with ``row`` first, then the columns with ``col``."""
    n, c, h, w = x.shape
    ct = _compute_dtype(x, out)
    col, row = col.astype(ct), row.astype(ct)
    rh, rw = len(col) // 2, len(row) // 2
    planes = _Planes(h, w, 0, rw, ct)  # rows are padded after the horizontal pass
    width = planes.width
    horiz = _Planes(h, width, rh, 0, ct)  # the horizontal result, padded vertically
    res = np.empty(h * width, ct)
    tmp = np.empty((h + 2 * rh) * width, ct)
    for i in range(n):
        for ch in range(c):
            src = planes.load(x[i, ch])
            hgrid = horiz.grid
            _correlate_1d(src, row, 1, hgrid[rh : rh + h].reshape(-1), tmp[: h * width])
            if rh:
                hgrid[:rh] = hgrid[rh]
                hgrid[rh + h :] = hgrid[rh + h - 1]
            _correlate_1d(horiz.flat, col, width, res, tmp[: h * width])
            _store(res, h, width, w, out[i, ch])


def depthwise_replicate(x: Array, k: Array, out: Array) -> None:
    """Correlate every plane of NCHW ``x`` with the 2-d ``k`` (odd sizes), borders replicated;
    ``out`` has x's shape. A 1-d ``k`` (one row or one column) runs as a separable filter."""
    kh, kw = k.shape
    if kh == 1 or kw == 1:
        one = np.ones(1, k.dtype)
        col, row = (one, k[0]) if kh == 1 else (k[:, 0], one)
        separable_filter(x, col, row, out)
        return
    n, c, h, w = x.shape
    ct = _compute_dtype(x, out)
    kc = k.astype(ct)
    planes = _Planes(h, w, kh // 2, kw // 2, ct)
    width = planes.width
    res = np.empty(h * width, ct)
    tmp = np.empty(h * width, ct)
    taps = [(i * width + j, kc[i, j]) for i in range(kh) for j in range(kw) if kc[i, j]]
    m = h * width
    for i in range(n):
        for ch in range(c):
            src = planes.load(x[i, ch])
            if not taps:
                res[...] = 0
            for t, (off, v) in enumerate(taps):
                if t == 0:
                    np.multiply(src[off : off + m], v, out=res)
                else:
                    np.multiply(src[off : off + m], v, out=tmp)
                    res += tmp
            _store(res, h, width, w, out[i, ch])


def sobel_magnitude(x: Array, out: Array) -> None:
    """``sqrt(gx^2 + gy^2)`` of the 3x3 Sobel filters (x: ``[-1 0 1]`` across, ``[1 2 1]``
    down; y its transpose) on every plane of NCHW ``x``, borders replicated."""
    n, c, h, w = x.shape
    ct = _compute_dtype(x, out)
    planes = _Planes(h, w, 1, 1, ct)
    width = planes.width
    full = (h + 2) * width  # every padded row
    m = h * width
    diff = np.empty(full, ct)  # p[., x+2] - p[., x]
    smooth = np.empty(full, ct)  # p[., x] + 2 p[., x+1] + p[., x+2]
    gx = np.empty(m, ct)
    gy = np.empty(m, ct)
    for i in range(n):
        for ch in range(c):
            p = planes.load(x[i, ch])
            np.subtract(p[2 : 2 + full], p[:full], out=diff)
            np.add(p[:full], p[2 : 2 + full], out=smooth)
            smooth += p[1 : 1 + full]
            smooth += p[1 : 1 + full]
            np.add(diff[:m], diff[2 * width : 2 * width + m], out=gx)
            gx += diff[width : width + m]
            gx += diff[width : width + m]
            np.subtract(smooth[2 * width : 2 * width + m], smooth[:m], out=gy)
            gx *= gx
            gy *= gy
            gx += gy
            np.sqrt(gx, out=gx)
            _store(gx, h, width, w, out[i, ch])


def grayscale(x: Array, weights: Array, out: Array) -> None:
    """``out[:, 0] = sum_c weights[c] * x[:, c]`` (the channels weights covers), plane by plane,
    summed in channel order as NumPy's ``w0 * x0 + w1 * x1 + ...`` does."""
    n, _, h, w = x.shape
    ct = _compute_dtype(x, out)
    wc = weights.astype(ct)
    acc = np.empty((h, w), ct)
    tmp = np.empty((h, w), ct)
    for i in range(n):
        for ch, wt in enumerate(wc):
            # Convert first: a mixed-dtype multiply goes through NumPy's slower buffered casts.
            dest = acc if ch == 0 else tmp
            np.copyto(dest, x[i, ch], casting="unsafe")
            dest *= wt
            if ch:
                acc += tmp
        over = _rounded_for(acc, out.dtype) if out.dtype.kind in "iu" else None
        out[i, 0] = acc
        if over is not None:
            out[i, 0][over] = _int_max(out.dtype)
