"""Representative workloads, shared by ``accelkit demo`` and the benchmarks.

Each workload exists twice: written with accelkit's TensorOps (runs on any backend) and written
plainly in NumPy (the reference the first is checked against, and a peer it is timed against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from accelkit.abc.backend import ComputeBackend
from accelkit.tensor import Tensor

__all__ = [
    "BlockConfig",
    "block_weights",
    "image_pipeline",
    "image_pipeline_numpy",
    "synthetic_images",
    "transformer_block",
    "transformer_block_numpy",
    "upload_weights",
]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class BlockConfig:
    """A pre-norm transformer block: causal self-attention and a 4x tanh-GELU MLP."""

    batch: int = 4
    seq: int = 256
    width: int = 512
    heads: int = 8
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def block_weights(cfg: BlockConfig, seed: int = 0) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    d = cfg.width

    def w(*shape: int) -> Array:
        out: Array = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        return out

    return {
        "ln1_g": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "ln1_b": (0.1 * rng.standard_normal(d)).astype(np.float32),
        "w_qkv": w(3 * d, d),
        "b_qkv": (0.02 * rng.standard_normal(3 * d)).astype(np.float32),
        "w_o": w(d, d),
        "b_o": (0.02 * rng.standard_normal(d)).astype(np.float32),
        "ln2_g": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "ln2_b": (0.1 * rng.standard_normal(d)).astype(np.float32),
        "w_1": w(4 * d, d),
        "b_1": (0.02 * rng.standard_normal(4 * d)).astype(np.float32),
        "w_2": w(d, 4 * d),
        "b_2": (0.02 * rng.standard_normal(d)).astype(np.float32),
    }


def upload_weights(backend: ComputeBackend, weights: dict[str, Array]) -> dict[str, Tensor]:
    """Copy the weights to the backend, with the fused QKV projection also split in three."""
    out = {k: backend.tensor_factory.from_host(v) for k, v in weights.items()}
    for i, name in enumerate("qkv"):
        rows = slice(i * len(weights["w_qkv"]) // 3, (i + 1) * len(weights["w_qkv"]) // 3)
        out[f"w_{name}"] = backend.tensor_factory.from_host(weights["w_qkv"][rows])
        out[f"b_{name}"] = backend.tensor_factory.from_host(weights["b_qkv"][rows])
    return out


def transformer_block(
    backend: ComputeBackend, x: Tensor, w: dict[str, Tensor], cfg: BlockConfig
) -> Tensor:
    """One block through TensorOps: a chain of submissions, nothing waited for."""
    ops = backend.tensor_ops
    b, s, d, h, hd = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.head_dim
    y = ops.layer_norm(x, w["ln1_g"], w["ln1_b"], cfg.eps)
    # Three projections rather than one fused QKV and a split: the same arithmetic, one copy
    # fewer. Each is [B, S, H, hd] once reshaped (a view), which attention takes as it is
    # (layout="bshd": no permute before or after where the backend reads it in place).
    q, k, v = (ops.reshape(ops.linear(y, w[f"w_{n}"], w[f"b_{n}"]), (b, s, h, hd)) for n in "qkv")
    att = ops.attention(q, k, v, causal=True, layout="bshd")  # [B, S, H, hd]
    att = ops.reshape(att, (b, s, d))
    x = ops.add(x, ops.linear(att, w["w_o"], w["b_o"]))
    y = ops.layer_norm(x, w["ln2_g"], w["ln2_b"], cfg.eps)
    m = ops.gelu(ops.linear(y, w["w_1"], w["b_1"]), approximate="tanh")
    return ops.add(x, ops.linear(m, w["w_2"], w["b_2"]))


def transformer_block_numpy(x: Array, w: dict[str, Array], cfg: BlockConfig) -> Array:
    """The same block written plainly in NumPy (float32 throughout)."""
    b, s, d, h, hd = cfg.batch, cfg.seq, cfg.width, cfg.heads, cfg.head_dim

    def ln(t: Array, g: Array, bias: Array) -> Array:
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        out: Array = (t - mu) / np.sqrt(var + cfg.eps) * g + bias
        return out

    y = ln(x, w["ln1_g"], w["ln1_b"])
    qkv = y @ w["w_qkv"].T + w["b_qkv"]
    qkv = qkv.reshape(b, s, 3, h, hd).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(hd))
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    p = scores / scores.sum(-1, keepdims=True)
    att = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
    x = x + att @ w["w_o"].T + w["b_o"]
    y = ln(x, w["ln2_g"], w["ln2_b"])
    m = y @ w["w_1"].T + w["b_1"]
    m = 0.5 * m * (1 + np.tanh(np.float32(0.7978845608028654) * (m + np.float32(0.044715) * m**3)))
    return x + m @ w["w_2"].T + w["b_2"]  # type: ignore[no-any-return]


def image_pipeline(backend: ComputeBackend, images: Tensor, threshold: float = 40.0) -> Tensor:
    """RGB u8 [N, 3, H, W] -> grayscale -> Gaussian blur -> Sobel magnitude -> binary edges."""
    ops = backend.tensor_ops
    gray = ops.grayscale(images)
    smooth = ops.gaussian_blur(gray, sigma=1.0)
    edges = ops.sobel_edges(smooth)
    return ops.threshold(edges, threshold, 255.0)


def image_pipeline_numpy(images: Array, threshold: float = 40.0) -> Array:
    """The same pipeline in NumPy: BT.601 luma, separable Gaussian and Sobel with edge
    replication, all in float32, rounded to u8 where the accelkit pipeline stores u8."""
    x = images.astype(np.float32)
    gray = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    gray = np.clip(np.rint(gray), 0, 255)
    r = np.arange(7) - 3
    g = np.exp(-(r**2) / 2.0)
    g = (g / g.sum()).astype(np.float32)

    def corr(img: Array, k: Array) -> Array:
        kh, kw = k.shape
        p = np.pad(img, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)), mode="edge")
        out = np.zeros_like(img)
        for i in range(kh):
            for j in range(kw):
                out += k[i, j] * p[:, i : i + img.shape[1], j : j + img.shape[2]]
        return out

    smooth = corr(corr(gray, g[None, :]), g[:, None])
    smooth = np.clip(np.rint(smooth), 0, 255)
    kx = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
    gx, gy = corr(smooth, kx), corr(smooth, kx.T.copy())
    mag = np.sqrt(gx * gx + gy * gy)
    return np.where(mag > threshold, 255.0, 0.0).astype(np.float32)[:, None]


def synthetic_images(rng: np.random.Generator, n: int, size: int) -> np.ndarray[Any, Any]:
    """Synthetic RGB u8 images with shapes and edges (discs and bars over noise)."""
    yy, xx = np.mgrid[0:size, 0:size]
    imgs = np.empty((n, 3, size, size), np.uint8)
    for i in range(n):
        cy, cx = rng.integers(size // 4, 3 * size // 4, 2).tolist()
        r = size // 5
        disc = ((yy - cy) ** 2 + (xx - cx) ** 2 < r * r).astype(np.float64)
        bars = ((xx // 32) % 2).astype(np.float64)
        for c in range(3):
            base = 60 + 120 * disc * rng.uniform(0.5, 1.0) + 40 * bars
            imgs[i, c] = np.clip(base + rng.normal(0, 4, (size, size)), 0, 255).astype(np.uint8)
    return imgs
