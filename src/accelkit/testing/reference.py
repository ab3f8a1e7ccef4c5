"""Independent float64 references, written from the textbook definitions with explicit loops.

Nothing here calls accelkit; every function takes and returns NumPy arrays. They are slow and
meant for small shapes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

_erf = np.vectorize(math.erf, otypes=[np.float64])


# -- elementwise ------------------------------------------------------------------------------------
def erf(x: Array) -> Array:
    result: Array = _erf(np.asarray(x, np.float64))
    return result


def gelu(x: Array) -> Array:
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Array) -> Array:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


UNARY: dict[str, Any] = {
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "abs": np.abs,
    "neg": np.negative,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,  # half to even
    "erf": erf,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}

BINARY: dict[str, Any] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": lambda a, b: a**b,
    "mod": lambda a, b: a - np.floor(a / b) * b,  # the sign of the divisor
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


# -- softmax and norms ------------------------------------------------------------------------------
def softmax(x: Array, axis: int = -1) -> Array:
    x = np.asarray(x, np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    result: Array = e / np.sum(e, axis=axis, keepdims=True)
    return result


def log_softmax(x: Array, axis: int = -1) -> Array:
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    result: Array = x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return result


def layer_norm(x: Array, weight: Array | None, bias: Array | None, eps: float) -> Array:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # the biased (population) variance
    y = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    result: Array = y
    return result


def rms_norm(x: Array, weight: Array | None, eps: float) -> Array:
    y: Array = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
    return y * weight if weight is not None else y


def cross_entropy(logits: Array, targets: Array, reduction: str) -> tuple[Array, Array]:
    n, _ = logits.shape
    probs = softmax(logits, axis=1)
    losses = np.array([-math.log(probs[i, int(targets[i])]) for i in range(n)])
    if reduction == "mean":
        return np.asarray(losses.mean()), probs
    if reduction == "sum":
        return np.asarray(losses.sum()), probs
    return losses, probs


# -- convolution and attention ----------------------------------------------------------------------
def conv2d(
    x: Array,
    w: Array,
    bias: Array | None = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> Array:
    """Cross-correlation with zero padding, one output element at a time."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        for a in range(kh):
                            for e in range(kw):
                                acc += (
                                    xp[b, g * cg + ci, i * sh + a * dh, j * sw + e * dw]
                                    * w[oc, ci, a, e]
                                )
                    out[b, oc, i, j] = acc + (bias[oc] if bias is not None else 0.0)
    return out


def attention(
    q: Array,
    k: Array,
    v: Array,
    scale: float | None = None,
    causal: bool = False,
    mask: Array | None = None,
) -> Array:
    """softmax(q k^T * scale + mask) v, one query row at a time; a row that sees no key is 0."""
    b, h, sq, d = q.shape
    _, hk, sk, _ = k.shape
    dv = v.shape[3]
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    m = None if mask is None else np.broadcast_to(mask, (b, h, sq, sk))
    out = np.zeros((b, h, sq, dv))
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            for i in range(sq):
                scores, visible = [], []
                for j in range(sk):
                    s = float(np.dot(q[bi, hi, i], k[bi, kv, j])) * sc
                    ok = True
                    if causal and j > i + (sk - sq):
                        ok = False
                    if m is not None:
                        if m.dtype == np.bool_:
                            ok = ok and bool(m[bi, hi, i, j])
                        else:
                            s += float(m[bi, hi, i, j])
                    if ok and s != -math.inf:
                        scores.append(s)
                        visible.append(j)
                if not visible:
                    continue
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for wgt, j in zip(weights, visible, strict=True):
                    out[bi, hi, i] += (wgt / total) * v[bi, kv, j]
    return out


# -- optimizer --------------------------------------------------------------------------------------
def adamw(
    p: Array,
    g: Array,
    m: Array,
    v: Array,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    weight_decay: float,
) -> tuple[Array, Array, Array]:
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1**step)
    v_hat = v / (1 - beta2**step)
    p = p - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p)
    return p, m, v


# -- images -----------------------------------------------------------------------------------------
GRAY = (0.299, 0.587, 0.114)


def to_nchw(img: Array) -> tuple[Array, bool]:
    """float64 [N, C, H, W] and whether the input was [H, W, C]."""
    x = np.asarray(img).astype(np.float64)
    if x.ndim == 3:
        return x.transpose(2, 0, 1)[None], True
    return x, False


def from_nchw(y: Array, hwc: bool) -> Array:
    return y[0].transpose(1, 2, 0) if hwc else y


def finish(y: Array, dtype: np.dtype[Any], clip: bool) -> Array:
    """Integer images round half to even and clip to 0..max; floats clip to [0, 1] if asked."""
    if np.issubdtype(dtype, np.integer):
        hi = 255 if dtype == np.uint8 else np.iinfo(dtype).max
        return np.clip(np.round(y), 0, hi)
    return np.clip(y, 0.0, 1.0) if clip else y


def filter_replicate(x: Array, kernel: Array) -> Array:
    """Apply ``kernel`` (cross-correlation) to each channel of NCHW ``x``; borders replicated."""
    kh, kw = kernel.shape
    _n, _c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)), mode="edge")
    out = np.zeros_like(x)
    for i in range(h):
        for j in range(w):
            window = xp[:, :, i : i + kh, j : j + kw]
            out[:, :, i, j] = np.einsum("ncab,ab->nc", window, kernel)
    return out


def gaussian_kernel(sigma: float, size: int | None) -> Array:
    ks = 2 * math.ceil(3 * sigma) + 1 if size is None else size
    r = np.arange(ks) - ks // 2
    g = np.exp(-(r**2) / (2 * sigma**2))
    g /= g.sum()
    return np.outer(g, g)


def gaussian_blur(img: Array, sigma: float, size: int | None = None) -> Array:
    x, hwc = to_nchw(img)
    y = filter_replicate(x, gaussian_kernel(sigma, size))
    return from_nchw(finish(y, img.dtype, clip=False), hwc)


SOBEL_X = np.array([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


def sobel_edges(img: Array) -> Array:
    x, hwc = to_nchw(img)
    gx = filter_replicate(x, SOBEL_X)
    gy = filter_replicate(x, SOBEL_X.T)
    return from_nchw(np.sqrt(gx**2 + gy**2), hwc)


def luma(x: Array) -> Array:
    """[N, 1, H, W] BT.601 luma of an NCHW RGB(A) image."""
    return (GRAY[0] * x[:, 0] + GRAY[1] * x[:, 1] + GRAY[2] * x[:, 2])[:, None]


def grayscale(img: Array) -> Array:
    x, hwc = to_nchw(img)
    return from_nchw(finish(luma(x), img.dtype, clip=False), hwc)


def threshold(img: Array, thresh: float, max_value: float) -> Array:
    return np.where(np.asarray(img).astype(np.float64) > thresh, max_value, 0.0)


def brightness(img: Array, factor: float) -> Array:
    x, hwc = to_nchw(img)
    return from_nchw(finish(x * factor, img.dtype, clip=True), hwc)


def contrast(img: Array, factor: float) -> Array:
    x, hwc = to_nchw(img)
    lum = luma(x) if x.shape[1] in (3, 4) else x.mean(axis=1, keepdims=True)
    mean = lum.mean(axis=(1, 2, 3), keepdims=True)
    return from_nchw(finish((x - mean) * factor + mean, img.dtype, clip=True), hwc)


def invert_colors(img: Array) -> Array:
    a = np.asarray(img)
    if np.issubdtype(a.dtype, np.integer):
        hi = 255 if a.dtype == np.uint8 else np.iinfo(a.dtype).max
        return hi - a.astype(np.float64)
    return 1.0 - a.astype(np.float64)


def sharpen(img: Array, amount: float) -> Array:
    x, hwc = to_nchw(img)
    a = amount
    k = np.array([[0.0, -a, 0.0], [-a, 1 + 4 * a, -a], [0.0, -a, 0.0]])
    return from_nchw(finish(filter_replicate(x, k), img.dtype, clip=True), hwc)


def avg_pool2d(
    x: Array, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int], oh: int, ow: int,
    count_include_pad: bool,
) -> Array:  # fmt: skip
    """PyTorch's definition, one window at a time: the window is clipped to the padded input
    for the divisor, and to the input for the sum (and the divisor without padding)."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
            h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
            pool = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
            total = x[:, :, h0:h1, w0:w1].astype(np.float64).sum(axis=(2, 3))
            out[:, :, i, j] = total / (pool if count_include_pad else (h1 - h0) * (w1 - w0))
    return out


def max_pool2d(
    x: Array, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int], d: tuple[int, int],
    oh: int, ow: int,
) -> Array:  # fmt: skip
    """The largest of each window's elements inside the input (padding never wins); NaN
    anywhere in a window gives NaN."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            rows = [i * s[0] - p[0] + a * d[0] for a in range(k[0])]
            cols = [j * s[1] - p[1] + e * d[1] for e in range(k[1])]
            rows = [r for r in rows if 0 <= r < h]
            cols = [q for q in cols if 0 <= q < w]
            window = x[:, :, rows][:, :, :, cols].reshape(n, c, -1)
            out[:, :, i, j] = window.max(axis=2)
    return out


def adaptive_avg_pool2d(x: Array, oh: int, ow: int) -> Array:
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        h0, h1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        for j in range(ow):
            w0, w1 = (j * w) // ow, -((-(j + 1) * w) // ow)
            out[:, :, i, j] = x[:, :, h0:h1, w0:w1].astype(np.float64).mean(axis=(2, 3))
    return out


def conv_transpose2d(
    x: Array, w: Array, bias: Array | None, stride: tuple[int, int], padding: tuple[int, int],
    output_padding: tuple[int, int], groups: int, dilation: tuple[int, int],
) -> Array:  # fmt: skip
    """The definition: every input pixel scatters ``x * weight`` into the output."""
    n, c_in, h, wd = x.shape
    _, c_out_g, kh, kw = w.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = stride, padding, output_padding, dilation
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    cg = c_in // groups
    full = np.zeros((n, c_out_g * groups, oh + 2 * ph + kh * dh, ow + 2 * pw + kw * dw))
    for ci in range(c_in):
        g = ci // cg
        for oc in range(c_out_g):
            for i in range(h):
                for j in range(wd):
                    for a in range(kh):
                        for e in range(kw):
                            full[:, g * c_out_g + oc, i * sh + a * dh, j * sw + e * dw] += (
                                x[:, ci, i, j].astype(np.float64) * w[ci, oc, a, e]
                            )
    out = full[:, :, ph : ph + oh, pw : pw + ow]
    if bias is not None:
        out = out + np.asarray(bias, np.float64)[None, :, None, None]
    return out
